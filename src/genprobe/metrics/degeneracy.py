"""Degeneration measures of one generated sequence: exact loop, near loop, tail compression, n-gram repeats.

How each detector scores a sequence, and why these rules: docs/calibration.md.

* Exact loop: the smallest period p whose p-periodic tail covers ``min_repeats`` periods and ``min_tail`` tokens.
* Near loop: over the last ``window`` tokens, for each period p,
  ``match_share(p) = #{i >= p : t[i] == t[i-p] or (i >= 2p and t[i] == t[i-2p])} / #{i >= p}``; the tail near-loops
  when the best share reaches ``min_match``.
* Tail compression: the last ``window`` tokens / the greedy LZ77 pieces (longest earlier copy, else one new token)
  that write them down — about 1 for text that does not repeat itself; at or above ``DEFAULT_MIN_COMPRESSION`` the
  tail is *repetitive*.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Sequence

from .ngrams import distinct_n, longest_repeated_ngram, seq_rep_n, unk_share

DEFAULT_MIN_TAIL = 8
DEFAULT_WINDOW = 32
DEFAULT_MAX_PERIOD = 28
DEFAULT_MIN_MATCH = 0.8
MIN_COMPARED = 8  # fewer compared positions than this cannot show a repetition
_EPS = 1e-9  # shares are ratios of small integers: 24/30 must count as >= 0.8
DEFAULT_MIN_COMPRESSION = 2.5  # human poems stay under 1.9 tail tokens per piece (docs/calibration.md)


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
    m, start = _matches(seq, best_p), max(T - window, best_p)
    while start - 1 >= best_p:  # slide the window back one token at a time while it still qualifies
        w = m[start - 1 : start - 1 + window]
        if sum(w) / len(w) < min_match - _EPS:
            break
        start -= 1
    while start < T and not m[start]:  # trim leading mismatches of the earliest qualifying window
        start += 1
    return NearLoopInfo(True, best_p, best_share, max(0, start - best_p))


def lz_pieces(tokens: Sequence[Hashable], start: int = 0) -> int:
    """Number of pieces (longest earlier copy, else one new token) that write ``tokens[start:]``."""
    seq = tuple(tokens)
    if not 0 <= start <= len(seq):
        raise ValueError(f"start must be in [0, {len(seq)}], got {start}")
    where: dict[Hashable, list[int]] = {}
    for j, t in enumerate(seq):
        where.setdefault(t, []).append(j)
    i, pieces = start, 0
    while i < len(seq):
        best = 1  # the longest copy from an earlier position holding the same token, else one new token
        for j in where[seq[i]]:
            if j >= i:
                break
            n = 1
            while i + n < len(seq) and seq[j + n] == seq[i + n]:
                n += 1
            best = max(best, n)
        i += best
        pieces += 1
    return pieces


def tail_compression(tokens: Sequence[Hashable], window: int = DEFAULT_WINDOW) -> float:
    """Last ``window`` tokens / their LZ pieces (references may reach before the tail); 0.0 for an empty input."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    seq = tuple(tokens)
    start = max(0, len(seq) - window)
    pieces = lz_pieces(seq, start)
    return (len(seq) - start) / pieces if pieces else 0.0


@dataclass(frozen=True)
class LoopSettings:
    """Detector parameters: exact loop (``min_tail``), near loop (``window``, ``max_period``, ``min_match``)
    and repetitive tail (``window``, ``min_compression``)."""

    min_tail: int = DEFAULT_MIN_TAIL
    window: int = DEFAULT_WINDOW
    max_period: int = DEFAULT_MAX_PERIOD
    min_match: float = DEFAULT_MIN_MATCH
    min_compression: float = DEFAULT_MIN_COMPRESSION

    def __post_init__(self) -> None:
        if self.min_compression < 1.0:
            raise ValueError(f"min_compression must be >= 1 tail token per piece, got {self.min_compression}")


@dataclass(frozen=True)
class LoopMeasures:
    """Loop and repetition measures of one sequence (token ids or characters)."""

    JSON_PROPERTIES = ("any_loop", "any_period", "any_onset", "degenerate")  # computed, kept in the JSON form

    length: int
    looping: bool  # exactly periodic tail (:func:`detect_loop`)
    period: int | None
    onset: int | None
    unit: tuple
    repeats: float
    near_looping: bool  # approximately periodic tail (:func:`detect_near_loop`)
    near_period: int | None
    near_match: float
    near_onset: int | None
    tail_compression: float  # tail tokens per LZ piece (:func:`tail_compression`)
    repetitive: bool  # tail_compression >= LoopSettings.min_compression: the tail copies earlier text
    seq_rep_4: float  # Welleck et al. 2019
    distinct_2: float
    longest_repeat: int  # longest n-gram seen >= 3 times

    @property
    def any_loop(self) -> bool:
        """Exact or near loop: the tail is periodic, exactly or up to substitutions (it has a period)."""
        return self.looping or self.near_looping

    @property
    def degenerate(self) -> bool:
        """Exact loop, near loop or repetitive tail: the measure a repair must lower.

        Each detector alone can be dodged — exact periodicity by one substitution per cycle, the
        near-loop share by shifting the unit — but not all three without writing new text.
        """
        return self.looping or self.near_looping or self.repetitive

    @property
    def any_period(self) -> int | None:
        """The exact period when exactly looping, else the near period when near-looping, else None."""
        return self.period if self.looping else self.near_period if self.near_looping else None

    @property
    def any_onset(self) -> int | None:
        """Onset belonging to :attr:`any_period`."""
        return self.onset if self.looping else self.near_onset if self.near_looping else None


def measure_loops(tokens: Sequence[Hashable], settings: LoopSettings | None = None) -> LoopMeasures:
    """Exact and near loop, tail compression, seq-rep-4, distinct-2 and longest repeat of one sequence."""
    s = settings or LoopSettings()
    seq = tuple(tokens)
    exact = detect_loop(seq, min_tail=s.min_tail)
    near = detect_near_loop(seq, window=s.window, max_period=s.max_period, min_match=s.min_match)
    compression = tail_compression(seq, s.window)
    return LoopMeasures(
        length=len(seq),
        looping=exact.looping,
        period=exact.period,
        onset=exact.onset,
        unit=exact.unit,
        repeats=exact.repeats,
        near_looping=near.near_looping,
        near_period=near.period,
        near_match=near.match_share,
        near_onset=near.onset,
        tail_compression=compression,
        repetitive=compression >= s.min_compression,
        seq_rep_4=seq_rep_n(seq, 4),
        distinct_2=distinct_n(seq, 2),
        longest_repeat=longest_repeated_ngram(seq, 3)[0],
    )


def degeneracy_metrics(tokens: Sequence[Hashable], unk_id: int = 1) -> dict:
    """distinct-1/2/3, longest n-gram seen >= 3 times, ``<unk>`` share, seq-rep-4 and the exact loop's fields."""
    seq = list(tokens)
    loop = detect_loop(seq)
    longest, ngram = longest_repeated_ngram(seq, 3)
    return {
        **{f"distinct_{n}": distinct_n(seq, n) for n in (1, 2, 3)},
        "longest_repeat": longest,
        "longest_repeat_ngram": list(ngram),
        "unk_share": unk_share(seq, unk_id),
        "seq_rep_4": seq_rep_n(seq, 4),
        "looping": loop.looping,
        "loop_period": loop.period,
        "loop_onset": loop.onset,
        "loop_unit": list(loop.unit),
    }
