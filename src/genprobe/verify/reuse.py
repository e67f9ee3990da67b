"""The sequences of the prefix-reuse phases: what a cache that reuses blocks across sequences must get right (the
classic bug, a lookup that matches too little, shows only when two sequences share *some* tokens and differ *somewhere
specific*). The plan (:func:`reuse_cases`), built around block sizes 8, 16 and 32, is tabled in docs/verify-cache.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

REUSE_LENGTH = 48  # tokens per sequence: 6 blocks of 8, 3 of 16, 1.5 of 32
DECODE = 2  # the last tokens of each sequence go through step(), one at a time
SHARED_CONTINUATIONS = (1, 4, 7, 8, 13, 15, 16, 24, 31, 32)
CHANGED_TOKENS = (7, 15, 31)  # the last token of a block of 8, 16 and 32
REPLACED_BLOCK = 16
SHORTER = (34, 22)  # lengths of the shorter cases: A's first 32 / 20 tokens prefilled, then DECODE others


@dataclass(frozen=True)
class ReuseCase:
    """One sequence of the prefix-reuse phases and how it relates to the base sequence A."""

    name: str
    kind: str  # base | continuation | token_changed | block_replaced | block_replaced_again | repeat | shorter
    shared: int  # leading tokens shared with A (len(A) for the repeat)
    seq: tuple[int, ...]


def _other(t: int, lo: int, vocab: int, k: int = 1) -> int:
    """A token id in [lo, vocab) other than ``t``."""
    return lo + (t - lo + k) % (vocab - lo)


def reuse_cases(base: Sequence[int], vocab: int, length: int, seed: int = 0) -> list[ReuseCase]:
    """The plan for a base of at least ``length`` tokens (cases needing more than ``length`` are left out)."""
    lo = 1 if vocab > 2 else 0
    if length < DECODE + 2 or vocab - lo < 2:
        return []
    a = [int(t) for t in base[:length]]
    (other,) = random_ids(vocab, [length], seed + 1)
    cases = [ReuseCase("A", "base", length, tuple(a))]
    last = length - DECODE  # a divergence must lie in the prefilled part, so that decode steps follow it
    for s in SHARED_CONTINUATIONS:
        if s < last:
            cont = other[s:]
            if cont[0] == a[s]:
                cont[0] = _other(a[s], lo, vocab)
            cases.append(ReuseCase(f"shared {s}", "continuation", s, tuple(a[:s] + cont)))
    for i in CHANGED_TOKENS:
        if i < last:
            b = list(a)
            b[i] = _other(a[i], lo, vocab)
            cases.append(ReuseCase(f"token {i} changed", "token_changed", i, tuple(b)))
    if REPLACED_BLOCK < last:
        head = [_other(t, lo, vocab, 1 + j % 3) for j, t in enumerate(a[:REPLACED_BLOCK])]
        x = tuple(head + a[REPLACED_BLOCK:])
        cases.append(ReuseCase(f"first {REPLACED_BLOCK} replaced", "block_replaced", 0, x))
        # run again: its own first blocks are now stored, and A's later blocks hold the same tokens
        cases.append(ReuseCase(f"first {REPLACED_BLOCK} replaced, again", "block_replaced_again", len(x), x))
    cases.append(ReuseCase("A again", "repeat", length, tuple(a)))
    for n in SHORTER:  # the prefilled part is A's; the stepped tokens are others (a cached tail must not show)
        if n < length:
            tail = [_other(t, lo, vocab) for t in a[n - DECODE : n]]
            cases.append(
                ReuseCase(f"first {n - DECODE} of A, then others", "shorter", n - DECODE, tuple(a[: n - DECODE] + tail))
            )
    return cases


def random_ids(vocab: int, lengths: Sequence[int], seed: int = 0, lo: int | None = None) -> list[list[int]]:
    """Seeded random token ids in [lo, vocab), one list per length, from one generator (``lo`` default: 1 when the
    vocabulary allows, leaving out 0, often padding): the verifiers' random prompts and extensions."""
    lo = (1 if vocab > 2 else 0) if lo is None else lo
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(lo, vocab, (max(n, 0),), generator=g).tolist() for n in lengths]


def situations(cases: list[ReuseCase], back_to_back: str | None) -> list[str]:
    """What the cases exercised, in words (``back_to_back``: None when run without reset(), else why not)."""
    if not cases:
        return []
    by_kind: dict[str, list[int]] = {}
    for c in cases:
        by_kind.setdefault(c.kind, []).append(c.shared)
    phrases = {  # {at}: the shared lengths / positions of that kind's cases
        "continuation": "shared prefix of {at} tokens, then other tokens",
        "token_changed": "one token changed at position {at} (last of a block of 8/16/32), the rest identical",
        "block_replaced": f"first {REPLACED_BLOCK} tokens replaced, the rest identical, run twice",
        "repeat": "the same sequence twice (a full cache hit)",
        "shorter": "prefixes of {at} tokens of a cached sequence, then other tokens",
    }
    out = [p.format(at=", ".join(map(str, by_kind[k]))) for k, p in phrases.items() if k in by_kind]
    b2b = (
        "back to back without reset()" if back_to_back is None else f"not back to back without reset(): {back_to_back}"
    )
    return [*out, "with reset() between sequences", b2b]
