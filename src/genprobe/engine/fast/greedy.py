"""Plain greedy generation in as few compiled calls as the runner allows: what :meth:`CompiledGPTRunner.greedy_all
<genprobe.engine.fast.compiled.CompiledGPTRunner.greedy_all>` runs for :func:`~genprobe.engine.generate.generate`.

Two shapes, tried in order:

- the whole generation in one call, prompt included (:meth:`generate_greedy`, the AOT programs' C++ loop);
- the prompt's forward, then every later step in one call (:meth:`decode_greedy`, a compiled ``while_loop`` or
  stepwise graph), booked as the per-step loop of ``generate`` books its steps.

Both produce what the per-step loop produces (tokens, finish reasons, raw logits of every step, what ``on_token``
sees, the forward counts); the eager loop is the reference they are tested against. Where compilation is not
available (None from the runner), nothing has been reported yet and :func:`greedy_all` returns None: the caller
runs its per-step loop from the start.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from ..samplers import check_logits


@dataclass
class GreedyRun:
    """A finished greedy generation: what :class:`~genprobe.engine.runner.GenerationResult` reports of it."""

    tokens: list[list[int]]
    finished: list[str]
    token_forwards: int
    forward_calls: int
    seconds: float
    step_logits: list[torch.Tensor] | None


def greedy_all(
    runner: Any,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    eos_id: int | None,
    on_token: Callable[[int, list[int]], None] | None,
    return_logits: bool,
) -> GreedyRun | None:
    """A plain greedy generation of ``max_new_tokens`` after each (left-padded) prompt; None where the runner cannot
    compile (then nothing was reported through ``on_token``)."""
    P = max(len(p) for p in prompts)
    N = int(max_new_tokens)
    whole = _whole(runner, prompts, P, N, eos_id, on_token, return_logits)
    return whole if whole is not None else _prefill_then_loop(runner, prompts, P, N, eos_id, on_token, return_logits)


def _prompt_batch(prompts: Sequence[Sequence[int]], P: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The prompts as one (B, P) batch, left-padded (padding is invisible, with no position), and its validity
    (None when no row is padded)."""
    B = len(prompts)
    if all(len(p) == P for p in prompts):
        return torch.tensor([[int(t) for t in p] for p in prompts], dtype=torch.long), None
    prompt = torch.full((B, P), pad_id, dtype=torch.long)
    valid = torch.zeros((B, P), dtype=torch.bool)
    for b, p in enumerate(prompts):
        prompt[b, P - len(p) :] = torch.as_tensor(list(p), dtype=torch.long)
        valid[b, P - len(p) :] = True
    return prompt, valid


def _whole(
    runner: Any,
    prompts: Sequence[Sequence[int]],
    P: int,
    N: int,
    eos_id: int | None,
    on_token: Callable[[int, list[int]], None] | None,
    return_logits: bool,
) -> GreedyRun | None:
    """The generation as one runner call, prompt included (None where the runner has no such call for this shape).

    At a few hundred microseconds per generation of a small model, the Python around the call is a fair share of
    the time: no token buffers here.
    """
    B = len(prompts)
    prompt, valid = _prompt_batch(prompts, P, runner.pad_id)
    t0 = time.perf_counter()
    with torch.inference_mode():
        state = runner.new_state(B, P + N)
        chunk = runner.generate_greedy(
            prompt.to(runner.device),
            None if valid is None else valid.to(runner.device),
            state,
            N,
            eos_id,
            return_logits,
        )
        runner.release_state(state)
    if chunk is None:
        return None
    seconds = time.perf_counter() - t0
    taken: int = chunk.tokens.shape[1]
    rows: list[list[int]] = chunk.tokens.tolist()
    finished = ["length"] * B
    if eos_id is not None:
        for b, row in enumerate(rows):
            if eos_id in row:  # a finished row emits padding after its eos: cut there
                rows[b] = row[: row.index(eos_id) + 1]
                finished[b] = "eos"
    if on_token is not None:
        shown = torch.where(chunk.valid, chunk.tokens, -1).tolist()
        for j in range(taken):
            on_token(j, [row[j] for row in shown])
    step_logits = [chunk.logits[:, j].float().clone() for j in range(taken)] if return_logits else None
    return GreedyRun(rows, finished, P + taken - 1, taken, seconds, step_logits)


def _prefill_then_loop(
    runner: Any,
    prompts: Sequence[Sequence[int]],
    P: int,
    N: int,
    eos_id: int | None,
    on_token: Callable[[int, list[int]], None] | None,
    return_logits: bool,
) -> GreedyRun | None:
    """The prompt's forward (step 0), then steps 1 .. N-1 in one compiled call, booked as the per-step loop does."""
    B = len(prompts)
    device = runner.device
    prompt, prompt_valid = _prompt_batch(prompts, P, runner.pad_id)
    buf = torch.full((B, P + N), runner.pad_id, dtype=torch.long, device=device)
    valid = torch.zeros((B, P + N), dtype=torch.bool, device=device)
    buf[:, :P] = prompt
    valid[:, :P] = True if prompt_valid is None else prompt_valid
    done = torch.zeros(B, dtype=torch.bool, device=device)
    lengths = [N] * B
    finished = ["length"] * B
    step_logits: list[torch.Tensor] | None = [] if return_logits else None
    t0 = time.perf_counter()
    with torch.inference_mode():
        state = runner.new_state(B, P + N)
        logits = runner.last_logits(buf[:, :P], None if prompt_valid is None else valid[:, :P], state)
        check_logits(logits, sampling=False)
        nxt = logits.argmax(dim=-1)
        if step_logits is not None:
            step_logits.append(logits.detach().float().clone())
        valid[:, P] = True  # no row has finished before its first token
        buf[:, P] = nxt
        steps_done = 1
        if eos_id is not None:
            newly = (nxt == eos_id) & ~done
            for b in newly.nonzero().flatten().tolist():
                lengths[b] = 1
                finished[b] = "eos"
            done |= newly
        chunk = None
        if N > 1 and not bool(done.all()):
            col = valid[:, P : P + 1] if eos_id is not None else None
            chunk = runner.decode_greedy(buf[:, P : P + 1], col, done, state, N - 1, eos_id, return_logits)
            if chunk is None:  # compilation unavailable: nothing reported yet, the caller's per-step loop decodes
                runner.release_state(state)
                return None
        # Reported only now, after the compiled call: a None above leaves nothing half-reported.
        if on_token is not None:
            on_token(0, torch.where(valid[:, P], nxt, -1).tolist())
        taken = 0
        if chunk is not None:
            taken = _book_chunk(chunk, buf, valid, done, P, eos_id, on_token, step_logits, lengths, finished)
        steps_done += taken
        runner.release_state(state)
    seconds = time.perf_counter() - t0
    out = buf[:, P : P + steps_done].tolist()
    tokens = [row[: min(lengths[b], steps_done)] for b, row in enumerate(out)]
    return GreedyRun(tokens, finished, P + taken, 1 + taken, seconds, step_logits)


def _book_chunk(
    chunk: Any,
    buf: torch.Tensor,
    valid: torch.Tensor,
    done: torch.Tensor,
    P: int,
    eos_id: int | None,
    on_token: Callable[[int, list[int]], None] | None,
    step_logits: list[torch.Tensor] | None,
    lengths: list[int],
    finished: list[str],
) -> int:
    """Book the tokens of ``chunk`` (steps 1, 2, ...) as the per-step loop books them; returns how many."""
    cur = P + 1
    taken: int = chunk.tokens.shape[1]
    buf[:, cur : cur + taken] = chunk.tokens
    valid[:, cur : cur + taken] = chunk.valid
    if eos_id is not None:
        before = done.tolist()
        for b, row in enumerate(chunk.tokens.tolist()):
            if not before[b] and eos_id in row:
                lengths[b] = 1 + row.index(eos_id) + 1
                finished[b] = "eos"
        done.copy_(chunk.done)
    if step_logits is not None:
        step_logits.extend(chunk.logits[:, j].float().clone() for j in range(taken))
    if on_token is not None:
        shown = torch.where(valid[:, cur : cur + taken], buf[:, cur : cur + taken], -1).tolist()
        for j in range(taken):
            on_token(1 + j, [row[j] for row in shown])
    return taken
