"""Exact loop detection: the smallest period p whose p-periodic tail covers ``min_repeats`` periods and ``min_tail``
tokens, with its onset (why these rules: docs/calibration.md, "How each detector scores a sequence")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Sequence

DEFAULT_MIN_TAIL = 8


@dataclass(frozen=True)
class LoopInfo:
    """Result of :func:`detect_loop`; ``onset`` indexes the first token of the periodic tail."""

    JSON_PROPERTIES = ("tail_length",)  # computed from the fields, kept in the JSON form

    looping: bool
    period: int | None = None
    onset: int | None = None
    unit: tuple = field(default_factory=tuple)
    repeats: float = 0.0  # tail length / period (may be fractional: the last unit can be partial)

    @property
    def tail_length(self) -> int:
        """Number of tokens covered by the repeating tail (0 when not looping)."""
        return int(round(self.repeats * self.period)) if self.looping and self.period else 0


def periodic_tail_length(tokens: Sequence[Hashable], period: int) -> int:
    """Length of the longest p-periodic suffix (at least ``min(period, len)``)."""
    seq = tuple(tokens)
    T = len(seq)
    if period < 1:
        raise ValueError(f"period must be >= 1, got {period}")
    if T <= period:
        return T
    run = 0
    i = T - 1
    while i - period >= 0 and seq[i] == seq[i - period]:
        run += 1
        i -= 1
    return run + period


def detect_loop(
    tokens: Sequence[Hashable],
    min_repeats: float = 2,
    max_period: int | None = None,
    min_tail: int = DEFAULT_MIN_TAIL,
) -> LoopInfo:
    """Find the smallest period whose periodic tail covers >= ``min_repeats`` units and >= ``min_tail`` tokens.

    ``max_period`` defaults to ``len(tokens) // min_repeats`` (any period with room for the
    required repeats, i.e. up to half the length at the default of 2).
    """
    if min_repeats < 2:
        raise ValueError(f"min_repeats must be >= 2 (one occurrence is not a repetition), got {min_repeats}")
    if min_tail < 1:
        raise ValueError(f"min_tail must be >= 1, got {min_tail}")
    seq = tuple(tokens)
    T = len(seq)
    limit = int(T // min_repeats)
    if max_period is not None:
        if max_period < 1:
            raise ValueError(f"max_period must be >= 1, got {max_period}")
        limit = min(limit, max_period)
    for p in range(1, limit + 1):
        tail = periodic_tail_length(seq, p)
        if tail >= min_repeats * p and tail >= min_tail:
            onset = T - tail
            return LoopInfo(True, p, onset, seq[onset : onset + p], tail / p)
    return LoopInfo(False)
