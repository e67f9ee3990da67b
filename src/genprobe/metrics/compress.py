"""Tail compression ratio: how many copy-or-new pieces does it take to write the tail down?

We factorise the last ``window`` tokens greedily, LZ77-style: at each position take the longest
copy of an earlier stretch of the sequence (it may start anywhere before the current position,
inside or before the tail, and may overlap the text it produces), or a single new token when
nothing matches. ``tail_compression = tail length / number of pieces``: about 1 for text that
does not repeat itself, the whole tail length when the tail continues a loop that started earlier.

Why not zlib on the tail's bytes: on a ~96-byte tail (32 CJK characters) its fixed costs (header, checksum,
Huffman tables) dominate, bytes per token differ between alphabets and tokenizers, and its output depends on
its version and level. The factorisation is exact, works on any hashables and reads directly: "k pieces".

It also sees what the period detectors cannot: a chant whose unit shifts, grows or shrinks from
cycle to cycle ("君不見，君不見君不見。君不見，君不見。") has no period, exact or approximate, yet
its tail is a handful of copies. A tail at or above ``DEFAULT_MIN_COMPRESSION`` is called
*repetitive* (:class:`genprobe.metrics.degeneracy.LoopMeasures`).
"""

from __future__ import annotations

from typing import Hashable, Sequence

from .nearloop import DEFAULT_WINDOW

# A tail this compressible repeats earlier text, aligned or not. No 57-character window of the bundled
# validation poems (lost-character placeholders aside) reaches 1.9 tail tokens per piece (median 1.0,
# 99th percentile 1.1); 2.5 leaves a margin for human text that repeats a phrase once.
DEFAULT_MIN_COMPRESSION = 2.5


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
