"""All degeneration measures of one generated sequence: exact loop, near loop, tail compression, n-gram repeats.

Tail compression: the last ``window`` tokens / the greedy LZ77 pieces (longest earlier copy, else one new token) that
write them down — about 1 for text that does not repeat itself; a tail at or above ``DEFAULT_MIN_COMPRESSION`` is
*repetitive* (why not zlib, and the calibration of 2.5: docs/calibration.md, "How each detector scores a sequence").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Sequence

from .loop import DEFAULT_MIN_TAIL, detect_loop
from .nearloop import DEFAULT_MAX_PERIOD, DEFAULT_MIN_MATCH, DEFAULT_WINDOW, detect_near_loop
from .ngrams import distinct_n, longest_repeated_ngram, seq_rep_n, unk_share

DEFAULT_MIN_COMPRESSION = 2.5  # human poems stay under 1.9 tail tokens per piece (docs/calibration.md)


def _longest_earlier_copy(seq: tuple, i: int, starts: list[int]) -> int:
    best = 0
    for j in starts:  # earlier positions holding the same token as position i
        if j >= i:
            break
        n = 1
        while i + n < len(seq) and seq[j + n] == seq[i + n]:
            n += 1
        best = max(best, n)
    return best


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
        i += max(_longest_earlier_copy(seq, i, where[seq[i]]), 1)
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
    looping: bool  # exactly periodic tail (genprobe.metrics.loop.detect_loop)
    period: int | None
    onset: int | None
    unit: tuple
    repeats: float
    near_looping: bool  # approximately periodic tail (genprobe.metrics.nearloop.detect_near_loop)
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


def degeneracy_metrics(tokens: Sequence[Hashable], unk_id: int = 1, *, min_tail: int = DEFAULT_MIN_TAIL) -> dict:
    """distinct-1/2/3, longest n-gram seen >= 3 times, ``<unk>`` share, seq-rep-4, exact and near loop fields."""
    seq = list(tokens)
    m = measure_loops(seq, LoopSettings(min_tail=min_tail))
    return {
        "length": m.length,
        "distinct_1": distinct_n(seq, 1),
        "distinct_2": m.distinct_2,
        "distinct_3": distinct_n(seq, 3),
        "longest_repeat": m.longest_repeat,
        "longest_repeat_ngram": list(longest_repeated_ngram(seq, 3)[1]),
        "unk_share": unk_share(seq, unk_id),
        "seq_rep_4": m.seq_rep_4,
        "looping": m.looping,
        "loop_period": m.period,
        "loop_onset": m.onset,
        "loop_unit": list(m.unit),
        "loop_repeats": m.repeats,
        "near_looping": m.near_looping,
        "near_period": m.near_period,
        "near_match": m.near_match,
        "tail_compression": m.tail_compression,
    }
