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
from typing import Callable, Sequence

import torch

from .runner import GenerationResult, ModelLike, Run, check_inputs, device_of, left_padded, runner_for
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
    ``compile=True`` drives a genprobe GPT, or a Llama-family ``transformers`` model (Llama, Qwen2/3,
    Mistral, Phi-3, run by :class:`~genprobe.model.llama_family.LlamaFamily` over its own weights), through the fast
    runner (:mod:`genprobe.engine.fast`: ``torch.compile``, ahead-of-time programs, C++ kernels), chosen once by
    :func:`~genprobe.engine.runner.runner_for`; the first call per model and batch size pays the compilation
    (SmolLM2-135M: ~2 min per batch size, then cached on disk). Everything else is the same loop.
    A sampler with ``penalty_alpha`` > 0 runs contrastive search (:mod:`genprobe.engine.contrastive`).
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
    kind: type[Run] = Run
    if CONTRASTIVE.active(cfg):
        from .contrastive import ContrastiveRun

        kind = ContrastiveRun
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
