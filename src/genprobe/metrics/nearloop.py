"""Near-loop detection: is the tail *approximately* periodic, with a tolerated share of substitutions?

Over the last ``window`` tokens, for each period p (docs/calibration.md, "How each detector scores a sequence"):
``match_share(p) = #{i >= p : t[i] == t[i-p] or (i >= 2p and t[i] == t[i-2p])} / #{i >= p}``; the tail near-loops
when the best share reaches ``min_match``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Sequence

DEFAULT_WINDOW = 32
DEFAULT_MAX_PERIOD = 28
DEFAULT_MIN_MATCH = 0.8
MIN_COMPARED = 8  # fewer compared positions than this cannot show a repetition
_EPS = 1e-9  # shares are ratios of small integers: 24/30 must count as >= 0.8


@dataclass(frozen=True)
class NearLoopInfo:
    """Result of :func:`detect_near_loop`; ``match_share`` is the best share even when not near-looping."""

    near_looping: bool
    period: int | None = None
    match_share: float = 0.0
    onset: int | None = None


def _matches(seq: tuple, p: int, two_back: bool = True) -> list[bool]:
    """m[i] (for i >= p): t[i] equals the token p (or, with ``two_back``, 2p) places back."""
    return [
        i >= p and (seq[i] == seq[i - p] or (two_back and i >= 2 * p and seq[i] == seq[i - 2 * p]))
        for i in range(len(seq))
    ]


def match_share(
    tokens: Sequence[Hashable], period: int, window: int = DEFAULT_WINDOW, *, two_back: bool = True
) -> float:
    """Share of the last ``window`` positions (those with a token ``period`` back) that repeat it (see module doc).

    ``two_back=False`` compares with one period back only (the plain lag-p share).
    """
    if period < 1:
        raise ValueError(f"period must be >= 1, got {period}")
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    seq = tuple(tokens)
    compared = _matches(seq, period, two_back)[max(len(seq) - window, period) :]
    return sum(compared) / len(compared) if compared else 0.0


def _onset(m: list[bool], p: int, window: int, min_match: float) -> int:
    T = len(m)
    start = max(T - window, p)
    while start - 1 >= p:  # slide the window back one token at a time while it still qualifies
        s = start - 1
        w = m[s : s + window]
        if sum(w) / len(w) < min_match - _EPS:
            break
        start = s
    while start < T and not m[start]:  # trim leading mismatches of the earliest qualifying window
        start += 1
    return max(0, start - p)


def detect_near_loop(
    tokens: Sequence[Hashable],
    *,
    window: int = DEFAULT_WINDOW,
    max_period: int = DEFAULT_MAX_PERIOD,
    min_match: float = DEFAULT_MIN_MATCH,
) -> NearLoopInfo:
    """Best approximate period of the last ``window`` tokens, its match share, and the onset (see module doc)."""
    if window < MIN_COMPARED:
        raise ValueError(f"window must be >= {MIN_COMPARED} tokens, got {window}")
    if max_period < 1:
        raise ValueError(f"max_period must be >= 1, got {max_period}")
    if not 0.0 < min_match <= 1.0:
        raise ValueError(f"min_match must be in (0, 1], got {min_match}")
    seq = tuple(tokens)
    T = len(seq)
    best_p, best_key = None, (0.0, 0.0)
    for p in range(1, min(max_period, T // 2) + 1):
        compared = T - max(T - window, p)
        if compared < MIN_COMPARED:
            continue
        # Looking two periods back credits p/2 fully for an exact period-p loop; the plain lag-p share
        # breaks that tie in favour of the true period (strict '>' keeps the smallest among equals).
        key = (match_share(seq, p, window), match_share(seq, p, window, two_back=False))
        if key > best_key:
            best_p, best_key = p, key
    best_share = best_key[0]
    if best_p is None or best_share < min_match - _EPS:
        return NearLoopInfo(False, best_p, best_share, None)
    return NearLoopInfo(True, best_p, best_share, _onset(_matches(seq, best_p), best_p, window, min_match))
