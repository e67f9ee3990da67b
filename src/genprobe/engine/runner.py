"""What the generation loops drive and return: the :class:`Runner` protocol, our GPT behind it (its one forward,
:func:`forward_step`), :func:`runner_for` (the one place a model's runner is chosen), the checks every loop makes on
its inputs, the loop's buffers (:class:`Run`) and :class:`GenerationResult` with what each step chose and how sure it
was (``step_stats``). ``generate``'s loop, one module up, drives a ``Run`` (or ``ContrastiveRun``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence, TypeAlias, cast

import torch
import torch.nn as nn

from .._io import NOT_JSON
from ..model.cache_protocol import CacheLike
from ..model.gpt import GPT
from ..model.llama_family import llama_family_of, unsupported_reason
from ..model.load import Model, max_positions, vocab_size
from ..model.position_lm import PositionDrivenLM
from .cache import KVCache
from .samplers.chain import process_logits, sample_next
from .samplers.stages import SamplerConfig


class Runner(Protocol):
    """What :func:`generate` needs from a model (our GPT is wrapped in :class:`GPTRunner`).

    Optional hooks a runner may add for speed (looked up with ``getattr``; the eager :class:`GPTRunner` has none,
    and its per-step loop in :func:`~genprobe.engine.generate.generate` is the reference every other runner is tested
    against); the fast runner (:mod:`genprobe.engine.fast`) implements all three:

    - ``greedy_all(prompt, prompt_valid, max_new_tokens, eos_id, on_token, return_logits)``: a whole plain greedy
      generation of a left-padded batch (argmax of the raw logits, no probabilities asked), or None to let the
      per-step loop run it;
    - ``last_logits(ids, valid, state)``: ``step(...)[:, -1]`` (a prompt's forward) computed more cheaply;
    - ``release_state(state)``: a generation's state given back for reuse.

    Contrastive search needs ``step_with_hidden(ids, valid, state)``: ``step`` plus the last hidden state after
    the final norm (both eager runners have it).
    """

    vocab_size: int
    max_positions: int | None  # hard context limit (learned positions), None if unbounded
    pad_id: int

    def new_state(self, batch_size: int, max_len: int) -> Any:
        """Fresh per-generation cache state for ``batch_size`` rows of up to ``max_len`` tokens."""

    def step(self, ids: torch.Tensor, valid: torch.Tensor | None, state: Any) -> torch.Tensor:
        """Cached forward of new tokens ``ids`` (B, T), ``valid`` (B, T) bool or None → logits (B, T, V)."""

    def full(self, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Uncached forward of the whole sequence (B, T) with key-padding ``valid`` → logits (B, T, V)."""


def forward_step(
    model: GPT,
    ids: torch.Tensor,
    cache: CacheLike | None = None,
    positions: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Run ``ids`` (B, T) through our GPT's one forward (prefill, decode, chunked prefill, verification); logits
    (B, T, V). Positions default to the cache's per-row count + ``arange(T)``. ``attention_mask`` may cover just the
    new tokens (B, T) or, HF style, the whole sequence so far (B, past + T); only the last T columns are new
    information. Overflowing the position table raises ``ValueError`` before any embedding lookup.
    """
    if ids.dim() == 1:
        ids = ids[None, :]
    T = ids.shape[1]
    if attention_mask is not None:
        if attention_mask.dim() != 2 or attention_mask.shape[0] != ids.shape[0] or attention_mask.shape[1] < T:
            raise ValueError(
                f"attention_mask shape {tuple(attention_mask.shape)} incompatible with ids {tuple(ids.shape)}"
            )
        attention_mask = attention_mask[:, -T:]
    logits: torch.Tensor = model(ids, positions=positions, cache=cache, attention_mask=attention_mask)
    return logits


class GPTRunner:
    """The reference GPT behind the :class:`Runner` protocol (cache = our preallocated :class:`KVCache`)."""

    pad_id = 0

    def __init__(self, model: GPT):
        self.model = model
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.vocab_size = vocab_size(model)
        self.max_positions = max_positions(model)

    def new_state(self, batch_size: int, max_len: int) -> KVCache:
        return KVCache.for_model(self.model.cfg, batch_size, max_len=max_len, dtype=self.dtype, device=self.device)

    def step(self, ids: torch.Tensor, valid: torch.Tensor | None, state: KVCache) -> torch.Tensor:
        return forward_step(self.model, ids, state, attention_mask=valid)

    def full(self, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        return forward_step(self.model, ids, attention_mask=valid)

    def step_with_hidden(
        self, ids: torch.Tensor, valid: torch.Tensor | None, state: KVCache
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`step` plus the last hidden state after the final norm, for contrastive search."""
        store: list[torch.Tensor] = []
        logits: torch.Tensor = self.model(ids, cache=state, attention_mask=valid, hidden_store=store)
        return logits, self.model.ln_f(store[-1])


#: What every generation entry point takes: a loaded :class:`~genprobe.model.load.Model`, a module (our GPT or a
#: ``transformers`` causal LM) or a ready :class:`Runner` (``HFCausalLM``, the fast runner, your own).
ModelLike: TypeAlias = "Model | nn.Module | Runner"


def runner_for(model: ModelLike, compile: bool = False) -> Runner:
    """The one place a model's runner is chosen: ``compile=True`` gives the fast runner
    (``CompiledGPTRunner.for_model`` of :func:`fast_module`), else the eager one: :class:`GPTRunner` for
    our GPT, ``HFCausalLM`` for a transformers LM; a runner passes through."""
    module = model.module if isinstance(model, Model) else model
    if compile:
        from .fast.compiled import CompiledGPTRunner  # the torch.compile machinery only when asked for

        return cast(Runner, CompiledGPTRunner.for_model(fast_module(module)))
    if isinstance(module, GPT):
        return GPTRunner(module)
    if all(hasattr(module, a) for a in ("new_state", "step", "full", "vocab_size")):
        return cast(Runner, module)  # duck-typed: the attributes generate() calls are checked just above
    if hasattr(module, "config") and callable(module):
        from .hf_adapter import HFCausalLM  # transformers models only: keeps this module free of the adapter

        return HFCausalLM(module)
    raise TypeError(f"expected a genprobe Model, GPT, transformers causal LM or runner, got {type(module).__name__}")


def fast_module(model: ModelLike) -> PositionDrivenLM:
    """What the fast runner compiles for ``model``: our GPT itself, or the :class:`LlamaFamily` forward over a
    Llama-family ``transformers`` model's own weights. ValueError naming why otherwise."""
    module = model.module if isinstance(model, Model) else model
    if isinstance(module, GPT):
        return module
    hf: Any = getattr(module, "model", None) if hasattr(module, "step") else module  # a runner wraps the HF model
    if hf is None or not hasattr(hf, "config"):
        raise ValueError(
            f"compile=True is for genprobe GPT and Llama-family transformers models, got {type(module).__name__}"
        )
    reason = unsupported_reason(hf)
    if reason is None:  # hooks on modules the view does not call (the model, its layers, attention, MLPs) would not run
        called = {id(m) for m in llama_family_of(hf).modules()}
        unseen = [(n or "the model", m) for n, m in hf.named_modules() if id(m) not in called]
        hooked = [n for n, m in unseen if m._forward_hooks or m._forward_pre_hooks]
        if hooked:
            more = " ..." if len(hooked) > 3 else ""
            reason = f"forward hooks on {', '.join(hooked[:3])}{more} would not run on its fast path"
    if reason is not None:
        raise ValueError(f"compile=True cannot run this transformers model: {reason}; use compile=False")
    view = llama_family_of(hf)
    view.training = hf.training  # the view's own flag (its submodules are the model's): the fast path reads it
    return view


@dataclass
class GenerationResult:
    """New tokens per row plus what the run cost; ``step_logits`` are the RAW model logits of each step."""

    tokens: list[list[int]]
    prompt_tokens: list[list[int]]
    finished: list[str]  # per row: "length" | "eos"
    token_forwards: int  # token positions pushed through the model per row (padding included)
    forward_calls: int
    mode: str
    sampler: dict[str, Any]
    seconds: float = 0.0
    # per step (B, V): the raw model output, and the sampling distribution; not in the JSON form
    step_logits: list[torch.Tensor] | None = field(default=None, metadata=NOT_JSON)
    step_probs: list[torch.Tensor] | None = field(default=None, metadata=NOT_JSON)

    def step_stats(self, token_str: Callable[[int], str], row: int = 0, top: int = 0) -> list[StepStat]:
        """Each step of row ``row``: its token and, with ``step_probs``, its probability, the entropy and kept count
        of the distribution it was drawn from and the ``top`` likeliest candidates."""
        out = []
        for i, t in enumerate(self.tokens[row]):
            stat = StepStat(step=i, token=int(t), text=token_str(int(t)))
            if self.step_probs is not None:
                p = self.step_probs[i][row]
                nz = p[p > 0]  # exact zeros contribute nothing to the entropy
                stat.prob, stat.entropy_nats, stat.kept = float(p[t]), float(-(nz * nz.log()).sum()), len(nz)
                if top:
                    vals, idx = torch.topk(p, min(top, p.numel()))
                    pairs = zip(vals.tolist(), idx.tolist(), strict=True)
                    stat.top = [Candidate(j, token_str(j), v) for v, j in pairs if v > 0]
            out.append(stat)
        return out


@dataclass
class Candidate:
    """One of the most likely tokens at a step."""

    token: int
    text: str
    prob: float


@dataclass
class StepStat:
    """One step of one row: the chosen token under the sampling distribution it was drawn from."""

    step: int
    token: int
    text: str
    prob: float | None = None  # probability of the chosen token (None when probabilities were not kept)
    entropy_nats: float | None = None
    kept: int | None = None  # tokens with non-zero probability after the sampler chain
    top: list[Candidate] = field(default_factory=list)


def format_steps(steps: Sequence[StepStat]) -> str:
    """The ``--top`` table: one line per step with its candidates."""
    lines = []
    for s in steps:
        cands = "  ".join(f"{c.text}:{c.prob:.3f}" for c in s.top)
        lines.append(
            f"step {s.step:3d} → {s.text!s:6} p={s.prob:.3f}  H={s.entropy_nats:.2f} nats "
            f"({(s.entropy_nats or 0.0) / math.log(2):.2f} bits)  kept={s.kept}  | {cands}"
        )
    return "\n".join(lines)


def check_inputs(runner: Runner, prompts: Sequence[Sequence[int]], max_new_tokens: int, mode: str) -> int:
    """The longest prompt's length, after checking the prompts, the count and the context limit (ValueError)."""
    if mode not in ("cached", "naive"):
        raise ValueError(f"mode must be 'cached' or 'naive', got {mode!r}")
    if not prompts:
        raise ValueError("prompts is empty: give at least one prompt")
    name = f"the model's context length {runner.max_positions} (block_size)"
    return check_prompt_ids(prompts, max_new_tokens, runner.vocab_size, runner.max_positions, name)


def check_prompt_ids(
    prompts: Sequence[Sequence[int]], max_new_tokens: int, vocab_size: int, limit: int | None, name: str, first: int = 0
) -> int:
    """The longest prompt's length, after refusing (ValueError) a token budget under 1, an empty prompt (numbered
    from ``first``), an id outside ``[0, vocab_size)`` and a generation past ``limit`` positions (``name`` says
    whose limit it is: every engine checks its prompts here)."""
    if int(max_new_tokens) != max_new_tokens or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    for i, p in enumerate(prompts, first):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty: every prompt needs at least one token")
        lo, hi = min(p), max(p)
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"prompt {i} holds token id outside [0, {vocab_size}): min {lo}, max {hi}")
    P = max(len(p) for p in prompts)
    if limit is not None and P + max_new_tokens > limit:
        raise ValueError(
            f"context overflow: longest prompt ({P} tokens) + max_new_tokens ({max_new_tokens}) = "
            f"{P + max_new_tokens} exceeds {name}; ask for at most {max(limit - P, 0)} new tokens"
        )
    return P


def left_padded(
    prompts: Sequence[Sequence[int]], P: int, N: int, pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token buffer (B, P+N) of left-padded prompts and its key validity (padding and the N new slots invalid)."""
    buf = torch.full((len(prompts), P + N), pad_id, dtype=torch.long, device=device)
    valid = torch.zeros((len(prompts), P + N), dtype=torch.bool, device=device)
    if all(len(p) == P for p in prompts):  # one assignment for the whole batch (64 rows: 0.27 vs 2.9 ms row by row)
        buf[:, :P] = torch.tensor([[int(t) for t in p] for p in prompts], dtype=torch.long)
        valid[:, :P] = True
        return buf, valid
    for b, p in enumerate(prompts):
        buf[b, P - len(p) : P] = torch.as_tensor(list(p), dtype=torch.long)
        valid[b, P - len(p) : P] = True
    return buf, valid


def device_of(runner: Runner) -> torch.device:
    """Where ``runner`` computes: its ``device``, else its (wrapped ``.model``'s) parameters'; CPU when it has none."""
    device = getattr(runner, "device", None)
    if device is not None:
        return torch.device(device)
    module: Any = getattr(runner, "model", runner)
    try:
        found: torch.device = next(module.parameters()).device
        return found
    except (AttributeError, StopIteration, TypeError):
        return torch.device("cpu")


class Run:
    """One generation's buffers (tokens and key validity, left-padded), its step records and where rows stopped:
    :func:`~genprobe.engine.generate.generate`'s loop calls ``logits``, ``choose`` and ``write`` per step (contrastive
    search, :class:`~genprobe.engine.generate.ContrastiveRun`, overrides them)."""

    def __init__(
        self,
        runner: Runner,
        prompts: Sequence[Sequence[int]],
        P: int,
        N: int,
        cfg: SamplerConfig,
        mode: str,
        eos_id: int | None,
        observed: bool,
        return_logits: bool,
        return_probs: bool,
    ):
        self.runner, self.P, self.N, self.cfg, self.mode, self.eos_id = runner, P, N, cfg, mode, eos_id
        B = len(prompts)
        self.buf, self.valid = left_padded(prompts, P, N, runner.pad_id, device_of(runner))
        self.padded = any(len(p) < P for p in prompts)
        # The validity buffer only needs updating when something reads it after the prompt.
        self.track_valid = mode == "naive" or eos_id is not None or cfg.uses_history or observed
        self.history = torch.where(self.valid, self.buf, -1) if cfg.uses_history else None
        # Where each row stopped: at its end token (kept in its tokens), else at the length budget N.
        self.done = torch.zeros(B, dtype=torch.bool, device=self.buf.device)
        self.lengths, self.finished = [N] * B, ["length"] * B
        self.step_logits: list[torch.Tensor] | None = [] if return_logits else None
        self.step_probs: list[torch.Tensor] | None = [] if return_probs else None
        self.forwards = self.calls = self.steps = 0

    def logits(self, i: int, state: Any) -> torch.Tensor:
        """Next-token logits at step ``i``: the whole prefix (naive, or the prompt's prefill), else one token."""
        cur, runner = self.P + i, self.runner
        self.calls += 1
        if self.mode == "naive":
            self.forwards += cur
            return runner.full(self.buf[:, :cur], self.valid[:, :cur])[:, -1]
        if i > 0:
            self.forwards += 1
            col = self.valid[:, cur - 1 : cur] if self.eos_id is not None else None
            return runner.step(self.buf[:, cur - 1 : cur], col, state)[:, -1]
        self.forwards += cur
        prompt_valid = self.valid[:, :cur] if self.padded else None
        # A runner that can skip the head for all but the last position (compiled) says so.
        last = getattr(runner, "last_logits", None)
        if last is not None:
            return cast(torch.Tensor, last(self.buf[:, :cur], prompt_valid, state))
        return runner.step(self.buf[:, :cur], prompt_valid, state)[:, -1]

    def choose(self, logits: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
        """The next token per row (sampler chain, or the raw argmax for plain greedy), recording what was asked."""
        hist = self.history[:, : self.P + self.steps] if self.history is not None else None
        processed = None
        if self.step_probs is not None or not self.cfg.is_identity:
            processed = process_logits(logits, hist, self.cfg, prompt_len=self.P, generator=gen)
        nxt = sample_next(logits, hist, self.cfg, gen, processed=processed, prompt_len=self.P)
        if self.step_logits is not None:
            self.step_logits.append(logits.detach().float().clone())
        if self.step_probs is not None:
            assert processed is not None  # computed above whenever probabilities are asked for
            self.step_probs.append(torch.softmax(processed, dim=-1))
        return nxt

    def write(self, i: int, nxt: torch.Tensor) -> torch.Tensor:
        """Append ``nxt`` at step ``i``; a finished row gets padding and stays invalid (returned as written)."""
        cur = self.P + i
        if self.eos_id is not None:
            nxt = torch.where(self.done, torch.full_like(nxt, self.runner.pad_id), nxt)
            self.valid[:, cur] = ~self.done
        elif self.track_valid:
            self.valid[:, cur] = True
        self.buf[:, cur] = nxt
        if self.history is not None:
            self.history[:, cur] = torch.where(self.valid[:, cur], nxt, -1)
        self.steps = i + 1
        return nxt

    def ended(self, i: int, nxt: torch.Tensor) -> bool:
        """Mark the rows that produced the end token at step ``i``; True when every row has."""
        if self.eos_id is None:
            return False
        newly = (nxt == self.eos_id) & ~self.done
        if not bool(newly.any()):
            return False
        for b in newly.nonzero().flatten().tolist():
            self.lengths[b], self.finished[b] = i + 1, "eos"
        self.done |= newly
        return bool(self.done.all())

    def result(self, prompts: Sequence[Sequence[int]], seconds: float) -> GenerationResult:
        """The generated tokens per row (up to its end token) and the run's counters."""
        rows = self.buf[:, self.P : self.P + self.steps].tolist()
        tokens = [row[: min(self.lengths[b], self.steps)] for b, row in enumerate(rows)]
        prompt_tokens = [list(map(int, p)) for p in prompts]
        counts = (self.forwards, self.calls, self.mode, self.cfg.to_dict(), seconds, self.step_logits, self.step_probs)
        return GenerationResult(tokens, prompt_tokens, self.finished, *counts)
