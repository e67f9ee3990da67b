"""A test-only :class:`~genprobe.engine.backend.Backend`: a new engine is one adapter, and every job written against
the protocol (the loop scan, the online monitor, verify-serving) runs on it.

The "model" is a first-order chain over ``VOCAB`` ids with full log-probabilities: after token ``t < TRAP`` the
likeliest next token is ``(t + 1) % TRAP`` (counting: a period of ``TRAP`` tokens, longer than any loop a short scan
can see), after ``GATE`` it is ``TRAP``, and inside the trap ``[TRAP, TRAP + PERIOD)`` it cycles — a prompt ending in
``GATE`` walks into a planted loop of period ``PERIOD``. Knobs: ``batch_shift`` makes the log-probabilities depend on
how many requests ``complete_many`` serves at once (a planted fault), and capability overrides make a poorer server
(``token_prompts=False``: text prompts only, written as space-separated ids; ``seed=False``: seeds ignored).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

import torch

from genprobe.engine.backend import Backend, Capabilities, Position, Request, Response, top_positions

VOCAB, TRAP, PERIOD = 64, 48, 3
GATE = VOCAB - 1
CAPABILITIES = Capabilities("fake", VOCAB, True, True, 4, True)


def next_token(t: int) -> int:
    """The likeliest token after ``t``."""
    if t == GATE:
        return TRAP
    if TRAP <= t < TRAP + PERIOD:
        return TRAP + (t - TRAP + 1) % PERIOD
    return (t + 1) % TRAP


def logprob_row(t: int, shift: float = 0.0) -> torch.Tensor:
    """Log-probabilities of the token after ``t``: the likeliest one far ahead, the rest on a gentle slope."""
    likeliest = next_token(t)
    logits = -0.05 * ((torch.arange(VOCAB) - likeliest) % VOCAB).double()
    logits[likeliest] = 4.0 + shift
    return torch.log_softmax(logits, -1)


class FakeBackend(Backend):
    """The scripted chain as a :class:`~genprobe.engine.backend.Backend`; ``capabilities`` may be overridden."""

    model_name = "fake-chain"

    def __init__(self, batch_shift: float = 0.0, **capabilities: Any):
        self.batch_shift = batch_shift
        self.capabilities = replace(CAPABILITIES, **capabilities)
        self.requests: list[Request] = []  # every request served, in order
        self.draws = 0  # where an unseeded (or seed-ignoring) draw starts

    def _generate(self, request: Request, shift: float) -> Response:
        if isinstance(request.prompt, str) == self.capabilities.token_prompts:
            raise ValueError("a token-id prompt is for a server with token_prompts, a text prompt for one without")
        prompt = [int(t) for t in request.prompt.split()] if isinstance(request.prompt, str) else list(request.prompt)
        s = request.api_sampler()
        seeded = s["seed"] is not None and self.capabilities.seed
        gen = torch.Generator().manual_seed(s["seed"] if seeded else self.draws)
        self.draws += 1
        ids, out = list(prompt), []
        for _ in range(request.max_tokens):
            row = logprob_row(ids[-1], shift).clone()
            row[list(request.sampler.ban_ids)] = float("-inf")
            if s["temperature"] == 0:
                tok = int(torch.argmax(row))
            else:
                tok = int(torch.multinomial(torch.softmax(row / s["temperature"], -1), 1, generator=gen))
            out.append(tok)
            ids.append(tok)
        rows = torch.stack([logprob_row(t, shift) for t in ids[:-1]]) if len(ids) > 1 else torch.zeros(0, VOCAB)
        positions = top_positions(rows[len(prompt) - 1 :], out, request.logprobs)
        prompt_positions: list[Position | None] | None = None
        if request.prompt_logprobs is not None:
            prompt_positions = [None, *top_positions(rows[: len(prompt) - 1], prompt[1:], request.prompt_logprobs)]
        text = " ".join(map(str, out))
        return Response(prompt, out, positions, "length", text, prompt_positions)

    def complete(self, request: Request) -> Response:
        """One request, on its own."""
        self.requests.append(request)
        return self._generate(request, 0.0)

    def complete_many(self, requests: Sequence[Request], concurrency: int) -> list[Response]:
        """All at once: with ``batch_shift``, the log-probabilities move with the batch size (the planted fault)."""
        self.requests.extend(requests)
        return [self._generate(r, self.batch_shift * (len(requests) - 1)) for r in requests]

    def tokenize(self, text: str) -> list[int] | None:
        """Space-separated ids."""
        return [int(t) for t in text.split()]
