"""All degeneration metrics of one generated sequence, as one plain dict."""

from __future__ import annotations

from typing import Hashable, Sequence

from .loop import DEFAULT_MIN_TAIL, detect_loop
from .ngrams import distinct_n, longest_repeated_ngram, seq_rep_n, unk_share


def degeneracy_metrics(
    tokens: Sequence[Hashable], unk_id: int = 1, *, min_tail: int = DEFAULT_MIN_TAIL
) -> dict:
    """distinct-1/2/3, longest n-gram seen >= 3 times, ``<unk>`` share, seq-rep-4 and the loop fields."""
    seq = list(tokens)
    rep_len, rep = longest_repeated_ngram(seq, 3)
    loop = detect_loop(seq, min_tail=min_tail)
    return {
        "length": len(seq),
        "distinct_1": distinct_n(seq, 1),
        "distinct_2": distinct_n(seq, 2),
        "distinct_3": distinct_n(seq, 3),
        "longest_repeat": rep_len,
        "longest_repeat_ngram": list(rep),
        "unk_share": unk_share(seq, unk_id),
        "seq_rep_4": seq_rep_n(seq, 4),
        "looping": loop.looping,
        "loop_period": loop.period,
        "loop_onset": loop.onset,
        "loop_unit": list(loop.unit),
        "loop_repeats": loop.repeats,
    }
