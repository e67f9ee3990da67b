"""N-gram degeneration metrics: distinct-n, seq-rep-n, longest repeated n-gram, ``<unk>`` share.

Tokens are any sequence of hashables: token ids (``list[int]``) or characters (a ``str``).
Conventions for degenerate inputs (documented once, used everywhere):

* a sequence with no n-grams (``len < n``) has ``distinct_n == 0.0`` and ``seq_rep_n == 0.0``:
  there is nothing to measure, and an empty output must never look "perfectly diverse";
* ``unk_share`` of an empty sequence is ``0.0``.
"""

from __future__ import annotations

from collections import Counter
from typing import Hashable, Sequence

Tokens = Sequence[Hashable]


def ngrams(tokens: Tokens, n: int) -> list[tuple]:
    """All ``len(tokens) - n + 1`` contiguous n-grams, in order (empty if too short)."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n-gram order must be an integer >= 1, got {n!r}")
    seq = tuple(tokens)
    return [seq[i : i + n] for i in range(len(seq) - n + 1)]


def distinct_n(tokens: Tokens, n: int) -> float:
    """Unique n-grams / total n-grams (the chapter's distinct-n); 0.0 when there is no n-gram."""
    grams = ngrams(tokens, n)
    return len(set(grams)) / len(grams) if grams else 0.0


def seq_rep_n(tokens: Tokens, n: int) -> float:
    """Fraction of n-grams repeating an earlier n-gram of the same sequence (Welleck et al. 2019).

    Equals ``1 - distinct_n`` for non-empty input; 0.0 when there is no n-gram.
    """
    share = distinct_n(tokens, n)  # never 0.0 when there is an n-gram
    return 1.0 - share if share else 0.0


def longest_repeated_ngram(tokens: Tokens, min_count: int = 3) -> tuple[int, tuple]:
    """Longest n-gram occurring at least ``min_count`` times: ``(length, ngram)``, ``(0, ())`` if none.

    Occurrences may overlap (so a period-p loop of length T gives an n-gram of length about T - 2p at
    ``min_count=3``). Ties go to the n-gram that occurs first.
    """
    if not isinstance(min_count, int) or min_count < 1:
        raise ValueError(f"min_count must be an integer >= 1, got {min_count!r}")
    seq = tuple(tokens)
    best: tuple[int, tuple] = (0, ())
    # Monotone: if an L-gram occurs >= min_count times, so does its (L-1)-prefix; stop at first failure.
    for length in range(1, len(seq) + 1):
        counts = Counter(seq[i : i + length] for i in range(len(seq) - length + 1))
        hits = [g for g, c in counts.items() if c >= min_count]  # Counter keeps first-seen order
        if not hits:
            break
        best = (length, hits[0])
    return best


def unk_share(ids: Sequence[Hashable], unk_id: int = 1) -> float:
    """Fraction of tokens equal to ``unk_id``; 0.0 for an empty sequence."""
    ids = list(ids)
    return ids.count(unk_id) / len(ids) if ids else 0.0
