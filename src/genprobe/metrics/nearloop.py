"""Near-loop detection: is the tail *approximately* periodic, with a tolerated share of substitutions?

The exact detector (:mod:`.loop`) says "loop" only when every tail token equals the token one period back, so an
edit that changes one token per cycle ("肅肅嚴禋，肅肅肅肅。肅肅嚴禋，…") makes it say "fixed" while the text still
chants. This detector looks at the last ``window`` tokens and, for each candidate period p, counts the positions
whose token equals the token p *or* 2p places back:

    match_share(p) = #{i in tail, i >= p : t[i] == t[i-p] or (i >= 2p and t[i] == t[i-2p])} / #{i in tail, i >= p}

Looking two cycles back matters: one substituted token breaks the lag-p comparison twice (at itself and one cycle
later), but the later position still matches two cycles back, so one substitution per cycle costs about 1/p, not
2/p. The tail near-loops when the best share over ``1 <= p <= max_period`` reaches ``min_match`` (default 0.8: one
changed token per cycle is tolerated for periods of 6 or more). A shorter loop with a token changed every cycle
is not a near loop by this rule — the documented limit; the tail compression ratio (:mod:`.compress`) beside it
still shows it (over 2 tail tokens per LZ piece, against under 1.9 in every 57-character window of the validation
poems without placeholders). The reported period has the highest share; ties go to the higher plain lag-p share
(an exact period-4 loop also matches fully at p = 2 two periods back), then to the smallest period.

The onset is where the approximate repetition begins: windows of ``window`` tokens slide back from the end while
their share at that period stays >= ``min_match``; leading mismatches of the earliest such window are trimmed, and
the onset is one period before its first matching position (the exact detector's convention). Natural text keeps
the share low (punctuation every 6 or 12 characters gives about 1/6); the tests check that no window of the
validation text near-loops.
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
