"""Generation loops: naive (recompute the prefix every step) and cached (KV cache + ``forward_step``).

Prompts of different lengths are left-padded into one batch. Padding is invisible: it gets no
position (positions count only real tokens) and its keys are masked, so a padded row yields the
same logits as the same prompt alone (seed §3.4.10). The loop writes into a preallocated token
buffer (no per-step ``torch.cat``, seed §3.10.7) and runs under ``torch.inference_mode()``.

``model`` is anything :func:`~genprobe.engine.runner.runner_for` turns into a
:class:`~genprobe.engine.runner.Runner`: a loaded ``Model``, our GPT, a ``transformers`` causal LM (driven with its
own cache by :class:`genprobe.engine.hf_adapter.HFCausalLM`) or a runner.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import torch

from .runner import GenerationResult as GenerationResult  # re-exported: callers import it from here
from .runner import ModelLike, RowEnds, Runner, check_inputs, device_of, left_padded, runner_for
from .samplers.chain import check_logits, process_logits, sample_next
from .samplers.stages import SamplerConfig

GREEDY = SamplerConfig(greedy=True)


def token_forward_count(prompt_len: int, new_tokens: int, mode: str) -> int:
    """Token forwards to generate ``new_tokens`` after ``prompt_len`` (seed §3.3.2): naive Σ(P+i), cached P+N−1."""
    if new_tokens <= 0:
        return 0
    if mode == "naive":
        return sum(prompt_len + i for i in range(new_tokens))
    return prompt_len + new_tokens - 1


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
    ``compile=True`` drives a genprobe GPT, or a Llama-family ``transformers`` model (Llama, Qwen2/3,
    Mistral, Phi-3, run by :class:`~genprobe.model.llama_family.LlamaFamily` over its own weights), through the fast
    runner (:mod:`genprobe.engine.fast`: ``torch.compile``, ahead-of-time programs, C++ kernels), chosen once by
    :func:`~genprobe.engine.runner.runner_for`; the first call per model and batch size pays the compilation
    (SmolLM2-135M: ~2 min per batch size, then cached on disk). Everything else is the same loop.
    A sampler with ``penalty_alpha`` > 0 runs contrastive search (:mod:`genprobe.engine.contrastive`).
    """
    if sampler is not None and sampler.is_contrastive:
        if compile or mode != "cached":
            raise ValueError("contrastive search runs eagerly over the KV cache: no compile=True, no mode='naive'")
        from .contrastive import contrastive_generate

        return contrastive_generate(
            model, prompts, max_new_tokens, sampler, eos_id, on_token, return_logits, return_probs
        )
    if compile and mode != "cached":
        raise ValueError("compile=True speeds up cached decoding; it does not apply to mode='naive'")
    runner = runner_for(model, compile)
    cfg = sampler or GREEDY
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
    run = _Run(runner, prompts, P, N, cfg, mode, eos_id, on_token is not None, return_logits, return_probs)
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
            if run.ends.update(i, nxt):
                break
        release = getattr(runner, "release_state", None)
        if release is not None and state is not None:  # a pooling runner reuses the cache for the next generation
            release(state)
    return run.result(prompts, time.perf_counter() - t0)


class _Run:
    """One generation's buffers (tokens and key validity, left-padded), its step records and where rows stopped."""

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
        self.plain_greedy = cfg.greedy and cfg.is_identity  # argmax of the raw logits, nothing to process
        self.ends = RowEnds(B, N, eos_id, self.buf.device)
        self.step_logits: list[torch.Tensor] | None = [] if return_logits else None
        self.step_probs: list[torch.Tensor] | None = [] if return_probs else None
        self.forwards = self.calls = self.steps = 0

    def logits(self, i: int, state: Any) -> torch.Tensor:
        """Next-token logits at step ``i``: the whole prefix (naive, or the prompt's prefill), else one token."""
        cur, runner = self.P + i, self.runner
        out: torch.Tensor
        self.calls += 1
        if self.mode == "naive":
            self.forwards += cur
            out = runner.full(self.buf[:, :cur], self.valid[:, :cur])[:, -1]
            return out
        if i == 0:
            self.forwards += cur
            prompt_valid = self.valid[:, :cur] if self.padded else None
            # A runner that can skip the head for all but the last position (compiled) says so.
            last = getattr(runner, "last_logits", None)
            if last is not None:
                out = last(self.buf[:, :cur], prompt_valid, state)
            else:
                out = runner.step(self.buf[:, :cur], prompt_valid, state)[:, -1]
            return out
        self.forwards += 1
        col = self.valid[:, cur - 1 : cur] if self.eos_id is not None else None
        out = runner.step(self.buf[:, cur - 1 : cur], col, state)[:, -1]
        return out

    def choose(self, logits: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
        """The next token per row (sampler chain, or the raw argmax for plain greedy), recording what was asked."""
        cfg = self.cfg
        hist = self.history[:, : self.P + self.steps] if self.history is not None else None
        processed = None
        if self.plain_greedy and self.step_probs is None:
            check_logits(logits, sampling=False)
            nxt = logits.argmax(dim=-1)
        else:
            if self.step_probs is not None or not cfg.is_identity:
                processed = process_logits(logits, hist, cfg, prompt_len=self.P, generator=gen)
            nxt = sample_next(logits, hist, cfg, gen, processed=processed, prompt_len=self.P)
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
            nxt = torch.where(self.ends.done, torch.full_like(nxt, self.runner.pad_id), nxt)
            self.valid[:, cur] = ~self.ends.done
        elif self.track_valid:
            self.valid[:, cur] = True
        self.buf[:, cur] = nxt
        if self.history is not None:
            self.history[:, cur] = torch.where(self.valid[:, cur], nxt, -1)
        self.steps = i + 1
        return nxt

    def result(self, prompts: Sequence[Sequence[int]], seconds: float) -> GenerationResult:
        """The generated tokens per row (up to its end token) and the run's counters."""
        tokens = self.ends.tokens(self.buf, self.P, self.steps)
        prompt_tokens = [list(map(int, p)) for p in prompts]
        counts = (self.forwards, self.calls, self.mode, self.cfg.to_dict(), seconds, self.step_logits, self.step_probs)
        return GenerationResult(tokens, prompt_tokens, self.ends.finished, *counts)
