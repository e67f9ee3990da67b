"""Generation loops: naive (recompute the prefix every step) and cached (KV cache + ``forward_step``).

Prompts of different lengths are left-padded into one batch. Padding is invisible: it gets no
position (positions count only real tokens) and its keys are masked, so a padded row yields the
same logits as the same prompt alone (seed §3.4.10). The loop writes into a preallocated token
buffer (no per-step ``torch.cat``, seed §3.10.7) and runs under ``torch.inference_mode()``.

``model`` is a :class:`~genprobe.model.GPT` or anything with the runner protocol of
:class:`~genprobe.engine.runner.Runner` — e.g. :class:`genprobe.engine.hf_adapter.HFCausalLM`, which drives a
``transformers`` causal LM with its own cache.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import torch

from .runner import GenerationResult as GenerationResult  # re-exported: callers import it from here
from .runner import GPTRunner as GPTRunner
from .runner import Runner as Runner
from .runner import as_runner as as_runner
from .runner import check_inputs, device_of, select_runner
from .sampling import SamplerConfig, check_logits, process_logits, sample_next

GREEDY = SamplerConfig(greedy=True)


def token_forward_count(prompt_len: int, new_tokens: int, mode: str) -> int:
    """Token forwards to generate ``new_tokens`` after ``prompt_len`` (seed §3.3.2): naive Σ(P+i), cached P+N−1."""
    if new_tokens <= 0:
        return 0
    if mode == "naive":
        return sum(prompt_len + i for i in range(new_tokens))
    return prompt_len + new_tokens - 1


def generate(
    model: Any,
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
    ``compile=True`` drives a genprobe GPT through the fast runner (:mod:`genprobe.engine.fast`: ``torch.compile``,
    ahead-of-time programs, C++ kernels), chosen once by :func:`~genprobe.engine.runner.select_runner`; the first
    call per model and batch size pays the compilation. Everything else is the same loop.
    A sampler with ``penalty_alpha`` > 0 runs contrastive search (:mod:`genprobe.engine.contrastive`).
    """
    if sampler is not None and sampler.is_contrastive:
        if compile or mode != "cached":
            raise ValueError("contrastive search runs eagerly over the KV cache: no compile=True, no mode='naive'")
        from .contrastive import contrastive_generate

        return contrastive_generate(
            model, prompts, max_new_tokens, sampler, eos_id, on_token, return_logits, return_probs
        )
    runner = select_runner(model, compile, mode)
    cfg = sampler or GREEDY
    P = check_inputs(runner, prompts, max_new_tokens, mode)
    N = int(max_new_tokens)
    B = len(prompts)
    device = getattr(runner, "device", None) or device_of(model)
    plain_greedy = cfg.greedy and cfg.is_identity  # argmax of the raw logits, nothing to process
    # A runner may run a whole plain greedy generation its own way (the fast runner: in one or two compiled
    # calls); the per-step loop below is the reference it is tested against, and runs where it declines (None).
    greedy_all = getattr(runner, "greedy_all", None) if mode == "cached" else None
    if greedy_all is not None and plain_greedy and not return_probs:
        run = greedy_all(prompts, N, eos_id, on_token, return_logits)
        if run is not None:
            return GenerationResult(
                tokens=run.tokens,
                prompt_tokens=[list(map(int, p)) for p in prompts],
                finished=run.finished,
                token_forwards=run.token_forwards,
                forward_calls=run.forward_calls,
                mode=mode,
                sampler=cfg.to_dict(),
                seconds=run.seconds,
                step_logits=run.step_logits,
                step_probs=None,
            )
    gen = None if cfg.greedy else torch.Generator(device="cpu").manual_seed(int(seed))

    # Preallocated token buffer and key-validity buffer (left padding = invalid).
    buf = torch.full((B, P + N), runner.pad_id, dtype=torch.long, device=device)
    valid = torch.zeros((B, P + N), dtype=torch.bool, device=device)
    padded = any(len(p) < P for p in prompts)
    if not padded:  # one assignment for the whole batch (64 rows: 0.27 vs 2.9 ms row by row)
        buf[:, :P] = torch.tensor([[int(t) for t in p] for p in prompts], dtype=torch.long)
        valid[:, :P] = True
    for b, p in enumerate(prompts if padded else ()):
        buf[b, P - len(p) : P] = torch.as_tensor(list(p), dtype=torch.long)
        valid[b, P - len(p) : P] = True
    # The validity buffer only needs updating when something reads it after the prompt.
    track_valid = mode == "naive" or eos_id is not None or cfg.uses_history or on_token is not None
    history_buf = torch.where(valid, buf, -1) if cfg.uses_history else None

    done = torch.zeros(B, dtype=torch.bool, device=device)
    lengths = [N] * B
    finished = ["length"] * B
    step_logits: list[torch.Tensor] | None = [] if return_logits else None
    step_probs: list[torch.Tensor] | None = [] if return_probs else None
    forwards = calls = 0
    steps_done = 0
    t0 = time.perf_counter()
    with torch.inference_mode():
        state = runner.new_state(B, P + N) if mode == "cached" else None
        i = 0
        while i < N:
            cur = P + i
            if mode == "naive" or i == 0:
                ids = buf[:, :cur]
                if mode == "naive":
                    logits = runner.full(ids, valid[:, :cur])[:, -1]
                else:
                    # A runner that can skip the head for all but the last position (compiled) says so.
                    last = getattr(runner, "last_logits", None)
                    prompt_valid = valid[:, :cur] if padded else None
                    if last is not None:
                        logits = last(ids, prompt_valid, state)
                    else:
                        logits = runner.step(ids, prompt_valid, state)[:, -1]
                forwards += cur
            else:
                col = valid[:, cur - 1 : cur] if eos_id is not None else None
                logits = runner.step(buf[:, cur - 1 : cur], col, state)[:, -1]
                forwards += 1
            calls += 1
            hist = history_buf[:, :cur] if history_buf is not None else None
            processed = None
            if plain_greedy and not return_probs:
                check_logits(logits, sampling=False)
                nxt = logits.argmax(dim=-1)
            else:
                if return_probs or not cfg.is_identity:
                    processed = process_logits(logits, hist, cfg, prompt_len=P, generator=gen)
                nxt = sample_next(logits, hist, cfg, gen, processed=processed, prompt_len=P)
            if step_logits is not None:
                step_logits.append(logits.detach().float().clone())
            if step_probs is not None:
                assert processed is not None  # computed above whenever probabilities are asked for
                step_probs.append(torch.softmax(processed, dim=-1))
            if eos_id is not None:
                nxt = torch.where(done, torch.full_like(nxt, runner.pad_id), nxt)
                valid[:, cur] = ~done
            elif track_valid:
                valid[:, cur] = True
            buf[:, cur] = nxt
            if history_buf is not None:
                history_buf[:, cur] = torch.where(valid[:, cur], nxt, -1)
            steps_done = i + 1
            if on_token is not None:
                on_token(i, torch.where(valid[:, cur], nxt, -1).tolist())
            if eos_id is not None:
                newly = (nxt == eos_id) & ~done
                if bool(newly.any()):
                    for b in newly.nonzero().flatten().tolist():
                        lengths[b] = i + 1
                        finished[b] = "eos"
                    done |= newly
                    if bool(done.all()):
                        break
            i += 1
        release = getattr(runner, "release_state", None)
        if release is not None and state is not None:  # a pooling runner reuses the cache for the next generation
            release(state)
    seconds = time.perf_counter() - t0
    out = buf[:, P : P + steps_done].tolist()
    tokens = [row[: min(lengths[b], steps_done)] for b, row in enumerate(out)]
    return GenerationResult(
        tokens=tokens,
        prompt_tokens=[list(map(int, p)) for p in prompts],
        finished=finished,
        token_forwards=forwards,
        forward_calls=calls,
        mode=mode,
        sampler=cfg.to_dict(),
        seconds=seconds,
        step_logits=step_logits,
        step_probs=step_probs,
    )
