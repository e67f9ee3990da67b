"""Plain greedy generation in as few compiled calls as the runner allows: what :meth:`CompiledGPTRunner.greedy_all
<genprobe.engine.fast.compiled.CompiledGPTRunner.greedy_all>` runs for :func:`~genprobe.engine.generate.generate`.

Two shapes, tried in order: the whole generation in one call, prompt included (:meth:`generate_greedy`, the AOT
programs' C++ loop); else the prompt's forward, then every later step in one call (:meth:`decode_greedy`, a compiled
``while_loop`` or stepwise graph). Both are booked as the per-step loop of ``generate`` books its steps (tokens,
finish reasons, raw logits of every step, what ``on_token`` sees, the forward counts); that eager loop is the
reference they are tested against. Where compilation is not available (None from the runner) nothing has been
reported yet and :func:`greedy_all` returns None: the caller runs its per-step loop from the start.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..samplers.chain import check_logits


@dataclass
class GreedyChunk:
    """What one compiled call of greedy decode steps returns (see ``compiled._decode_loop``)."""

    tokens: torch.Tensor  # (B, steps run) long
    valid: torch.Tensor  # (B, steps run) bool: False for the padding a finished row emits
    done: torch.Tensor  # (B,) bool, rows finished after the call
    logits: torch.Tensor | None  # (B, steps run, V) raw logits of every step, when asked for


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
    prompt: torch.Tensor,
    prompt_valid: torch.Tensor | None,
    max_new_tokens: int,
    eos_id: int | None,
    on_token: Callable[[int, list[int]], None] | None,
    return_logits: bool,
) -> GreedyRun | None:
    """A plain greedy generation of ``max_new_tokens`` after the (B, P) left-padded ``prompt`` (``prompt_valid``:
    None when no row is padded); None where the runner cannot compile (then nothing was reported through
    ``on_token``).

    At a few hundred microseconds per generation of a small model, the Python around the calls is a fair share of
    the time: no token buffers here, the chunks the runner returns are the record.
    """
    (B, P), N = prompt.shape, int(max_new_tokens)
    t0 = time.perf_counter()
    with torch.inference_mode():
        state = runner.new_state(B, P + N)
        chunk = runner.generate_greedy(prompt, prompt_valid, state, N, eos_id, return_logits)
        if chunk is None:
            chunk = _prefill_then_loop(runner, prompt, prompt_valid, state, N, eos_id, return_logits)
        runner.release_state(state)
    if chunk is None:
        return None
    seconds = time.perf_counter() - t0
    taken: int = chunk.tokens.shape[1]
    rows: list[list[int]] = chunk.tokens.tolist()
    finished = ["length"] * len(rows)
    if eos_id is not None:
        for b, row in enumerate(rows):
            if eos_id in row:  # a finished row emits padding after its eos: cut there
                rows[b], finished[b] = row[: row.index(eos_id) + 1], "eos"
    # Reported only now, after the compiled calls: a None above leaves nothing half-reported.
    if on_token is not None:
        shown = torch.where(chunk.valid, chunk.tokens, -1).tolist()
        for j in range(taken):
            on_token(j, [row[j] for row in shown])
    logits = chunk.logits
    step_logits = [logits[:, j].float().clone() for j in range(taken)] if logits is not None else None
    return GreedyRun(rows, finished, P + taken - 1, taken, seconds, step_logits)


def _prefill_then_loop(
    runner: Any,
    prompt: torch.Tensor,
    prompt_valid: torch.Tensor | None,
    state: Any,
    N: int,
    eos_id: int | None,
    return_logits: bool,
) -> GreedyChunk | None:
    """The prompt's forward (step 0), then steps 1 .. N-1 in one compiled call, as one chunk of every step."""
    logits = runner.last_logits(prompt, prompt_valid, state)
    check_logits(logits, sampling=False)
    first = logits.argmax(dim=-1)
    done = first == eos_id if eos_id is not None else torch.zeros_like(first, dtype=torch.bool)
    out = GreedyChunk(first[:, None], torch.ones_like(first[:, None], dtype=torch.bool), done, None)
    out.logits = logits[:, None].float() if return_logits else None
    if N == 1 or bool(done.all()):
        return out
    rest = runner.decode_greedy(out.tokens, None, done, state, N - 1, eos_id, return_logits)
    if rest is None:  # compilation unavailable: nothing reported yet, the caller's per-step loop decodes
        return None
    tokens, valid = torch.cat([out.tokens, rest.tokens], 1), torch.cat([out.valid, rest.valid], 1)
    if out.logits is not None and rest.logits is not None:
        out.logits = torch.cat([out.logits, rest.logits.float()], 1)
    return GreedyChunk(tokens, valid, rest.done, out.logits)
