"""Degeneration metrics: distinct-n, seq-rep-n, longest repeated n-gram, ``<unk>`` share, loop detection."""

from .degeneracy import degeneracy_metrics
from .loop import DEFAULT_MIN_TAIL, LoopInfo, detect_loop, periodic_tail_length
from .ngrams import distinct_n, longest_repeated_ngram, ngrams, seq_rep_n, unk_share
from .stats import wilson_interval

__all__ = [
    "DEFAULT_MIN_TAIL",
    "LoopInfo",
    "degeneracy_metrics",
    "detect_loop",
    "distinct_n",
    "longest_repeated_ngram",
    "ngrams",
    "periodic_tail_length",
    "seq_rep_n",
    "unk_share",
    "wilson_interval",
]
