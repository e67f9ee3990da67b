"""Generation loops: naive (recompute the prefix every step) and cached (KV cache + ``forward_step``).

Prompts of different lengths are left-padded into one batch. Padding is invisible: it gets no position (positions count
only real tokens) and its keys are masked, so a padded row yields the same logits as the same prompt alone (seed
§3.4.10). The loop writes into a preallocated token buffer (no per-step ``torch.cat``, seed §3.10.7) and runs under
``torch.inference_mode()``. Contrastive search (:class:`ContrastiveRun`) runs through the same loop.
"""

from __future__ import annotations

import copy
import time
from typing import Any, Callable, Sequence

import torch

from .cache import KVCache
from .runner import GenerationResult, ModelLike, Run, check_inputs, device_of, left_padded, runner_for
from .samplers.chain import adjust_logits, check_logits
from .samplers.stages import CONTRASTIVE, SamplerConfig

GREEDY = SamplerConfig(greedy=True)


def generate(
    model: ModelLike,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    sampler: SamplerConfig | None = None,
    mode: str = "cached",
    seed: int = 0,
    eos_id: int | None = None,
    return_logits: bool = False,
    return_probs: bool = False,
    on_token: Callable[[int, list[int]], None] | None = None,
    compile: bool = False,
) -> GenerationResult:
    """Generate ``max_new_tokens`` after each prompt (left-padded batch); greedy when ``sampler`` is None.

    ``on_token(step, token_ids)`` is called after every step with one new id per row (rows that
    already finished get ``-1``). Rows stop at ``eos_id`` (the eos token is kept in ``tokens``).
    ``compile=True`` drives our GPT or a Llama-family ``transformers`` model through the fast runner
    (:mod:`genprobe.engine.fast`, :func:`~genprobe.engine.runner.fast_module`); the first call per model and batch
    size compiles (SmolLM2-135M: ~2 min per batch size, then cached on disk). Everything else is the same loop.
    A sampler with ``penalty_alpha`` > 0 runs contrastive search (:class:`ContrastiveRun`).
    """
    cfg = sampler or GREEDY
    if CONTRASTIVE.active(cfg) and (compile or mode != "cached"):
        raise ValueError("contrastive search runs eagerly over the KV cache: no compile=True, no mode='naive'")
    if compile and mode != "cached":
        raise ValueError("compile=True speeds up cached decoding; it does not apply to mode='naive'")
    runner = runner_for(model, compile)
    P = check_inputs(runner, prompts, max_new_tokens, mode)
    N = int(max_new_tokens)
    # A runner may run a whole plain greedy generation its own way (the fast runner: in one or two compiled calls);
    # the per-step loop below is the reference it is tested against, and runs where it declines (None).
    greedy_all = getattr(runner, "greedy_all", None) if mode == "cached" else None
    if greedy_all is not None and cfg.greedy and cfg.is_identity and not return_probs:
        prompt, valid = left_padded(prompts, P, 0, runner.pad_id, device_of(runner))
        padded = any(len(p) < P for p in prompts)
        run = greedy_all(prompt, valid if padded else None, N, eos_id, on_token, return_logits)
        if run is not None:
            counts = (run.token_forwards, run.forward_calls, mode, cfg.to_dict(), run.seconds, run.step_logits)
            return GenerationResult(run.tokens, [list(map(int, p)) for p in prompts], run.finished, *counts)
    kind = ContrastiveRun if CONTRASTIVE.active(cfg) else Run
    run = kind(runner, prompts, P, N, cfg, mode, eos_id, on_token is not None, return_logits, return_probs)
    gen = None if cfg.greedy else torch.Generator(device="cpu").manual_seed(int(seed))
    t0 = time.perf_counter()
    with torch.inference_mode():
        state = runner.new_state(len(prompts), P + N) if mode == "cached" else None
        for i in range(N):
            logits = run.logits(i, state)
            nxt = run.choose(logits, gen)
            nxt = run.write(i, nxt)
            if on_token is not None:
                on_token(i, torch.where(run.valid[:, P + i], nxt, -1).tolist())
            if run.ended(i, nxt):
                break
        release = getattr(runner, "release_state", None)
        if release is not None and state is not None:  # a pooling runner reuses the cache for the next generation
            release(state)
    return run.result(prompts, time.perf_counter() - t0)


def rank_candidates(
    context: torch.Tensor, context_mask: torch.Tensor, cand_hidden: torch.Tensor, cand_probs: torch.Tensor, alpha: float
) -> torch.Tensor:
    """Index (B,) of the best of k candidates: (1 − α)·p − α·max cosine to the context (HF _ranking_fast)."""
    B, k = cand_probs.shape
    ctx = context.repeat_interleave(k, dim=0)
    norm_ctx = ctx / ctx.norm(dim=2, keepdim=True)
    norm_next = cand_hidden / cand_hidden.norm(dim=2, keepdim=True)
    cosine = torch.matmul(norm_ctx, norm_next.transpose(1, 2)).squeeze(-1)  # (B·k, S)
    mask = context_mask.repeat_interleave(k, dim=0).to(cosine.dtype)
    cosine = cosine + (1 - mask) * torch.finfo(cosine.dtype).min  # padding never counts
    penalty = cosine.max(dim=-1).values
    score = (1.0 - alpha) * cand_probs.reshape(-1) - alpha * penalty
    return torch.stack(torch.split(score, k)).max(dim=-1).indices


class ContrastiveRun(Run):
    """Contrastive search (Su et al. 2022) with HF's semantics, over our KV cache or a transformers model's. Each step
    keeps the ``top_k`` most probable next tokens (after the adjustments: bans, penalties, no-repeat-n-gram, DRY —
    HF's logits processors), runs all of them through the model in one batch of B·k rows, and picks per row the
    candidate maximising

        (1 − α) · p(candidate) − α · max_j cos(h_candidate, h_j)

    where ``h`` is the model's last hidden state (after the final norm, what HF's ``hidden_states[-1]`` holds) and
    ``j`` runs over every earlier real position, prompt included (transformers 4.x
    ``GenerationMixin._contrastive_search`` / ``_ranking_fast``; transformers 5 moved it to a Hub repository). The
    chosen candidate's forward already produced the next step's logits and cache entry, so a step costs one batched
    forward of k tokens per row.

    The cache holds B·k rows for the whole generation. HF copies the whole cache twice per step (repeat, then
    select); for our :class:`~genprobe.engine.cache.KVCache` only the newest slot is copied from the chosen row to
    the others of its group. A transformers cache is handled as HF does (``batch_select_indices``). ``step_probs``
    are the candidate distributions: softmax of the adjusted logits.
    """

    history: torch.Tensor  # what the penalties read, always kept: the candidates are ranked after the adjustments

    def __init__(self, *args: Any):
        super().__init__(*args)
        cfg, runner, self.mode = self.cfg, self.runner, "contrastive"
        assert cfg.top_k is not None  # SamplerConfig validation: contrastive search needs top_k >= 2
        self.k = int(cfg.top_k)
        if self.k > runner.vocab_size:
            raise ValueError(f"top_k={self.k} candidates exceed the vocabulary of {runner.vocab_size} tokens")
        self.history = torch.where(self.valid, self.buf, -1)  # -1 = padding
        self.groups = torch.arange(self.buf.shape[0], device=self.buf.device) * self.k
        forward = getattr(runner, "step_with_hidden", None)
        if forward is None:
            raise TypeError(f"contrastive search needs a runner with step_with_hidden, got {type(runner).__name__}")
        self.forward: Callable[..., tuple[torch.Tensor, torch.Tensor]] = forward

    def logits(self, i: int, state: Any) -> torch.Tensor:
        """The next logits: at step 0 the prompts' (run once, their hidden states kept, the cache then repeated k
        times), later the chosen candidate's, from the step that chose it."""
        if i == 0:
            P, padded = self.P, not bool(self.valid[:, : self.P].all())
            logits, hidden = self.forward(self.buf[:, :P], self.valid[:, :P] if padded else None, state)
            self.context = hidden.new_zeros(*self.buf.shape, hidden.shape[-1])
            self.context[:, :P] = hidden
            self.next_logits = logits[:, -1].float()
            self.state = state  # every row repeated k times (row b → rows b·k … b·k+k−1)
            if isinstance(state, KVCache):
                if state.window is not None:
                    raise ValueError("contrastive search does not support a sliding-window KVCache")
                self.state = big = copy.copy(state)  # the counters as they are; the tensors repeated (fresh)
                big.batch_size = state.batch_size * self.k
                big.k, big.v = state.k.repeat_interleave(self.k, dim=1), state.v.repeat_interleave(self.k, dim=1)
                big.pos, big.valid = state.pos.repeat_interleave(self.k, 0), state.valid.repeat_interleave(self.k, 0)
            else:  # a transformers cache
                state.cache.batch_repeat_interleave(self.k)
                state.mask = state.mask.repeat_interleave(self.k, dim=0)
            self.state.next_pos = state.next_pos.repeat_interleave(self.k)
            self.forwards, self.calls = P, 1
        return self.next_logits

    def choose(self, logits: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
        """Each row's best of its k most probable candidates, all run through the model in one batch of B·k rows."""
        cur = self.P + self.steps
        check_logits(logits, sampling=False)
        adjusted = adjust_logits(logits, self.history[:, :cur], self.cfg, prompt_len=self.P)
        probs = torch.softmax(adjusted, dim=-1)
        cand_probs, cand_ids = torch.topk(probs, dim=-1, k=self.k)
        out, cand_hidden = self.forward(cand_ids.reshape(-1, 1), None, self.state)
        alpha = self.cfg.penalty_alpha
        sel = rank_candidates(self.context[:, :cur], self.valid[:, :cur], cand_hidden, cand_probs, alpha)
        chosen = self.groups + sel
        rows = chosen.repeat_interleave(self.k)  # row i of the state now holds row rows[i]'s newest entry or history
        if isinstance(self.state, KVCache):  # every row of a group differs only in the slot just written
            for buf in (self.state.k[:, :, :, self.state.seen - 1], self.state.v[:, :, :, self.state.seen - 1]):
                buf.copy_(buf.index_select(1, rows))
        else:  # a transformers cache, as HF does
            self.state.cache.batch_select_indices(rows.to(self.state.mask.device))
        self.context[:, cur] = cand_hidden[chosen, -1]
        self.next_logits = out[chosen, -1].float()
        self.forwards, self.calls = self.forwards + self.k, self.calls + 1
        if self.step_logits is not None:
            self.step_logits.append(logits.detach().clone())
        if self.step_probs is not None:
            self.step_probs.append(probs)
        return cand_ids[torch.arange(len(sel), device=sel.device), sel]

    def write(self, i: int, nxt: torch.Tensor) -> torch.Tensor:
        """Append ``nxt``: a finished row's token is padding, in the cache either way, and shown as -1."""
        cur, done = self.P + i, self.done
        shown = torch.where(done, torch.full_like(nxt, -1), nxt)  # finished rows emit nothing
        self.buf[:, cur], self.valid[:, cur] = torch.where(done, self.runner.pad_id, nxt), True
        self.history[:, cur] = shown
        self.steps = i + 1
        return shown
