"""Degeneration metrics: distinct-n, seq-rep-n, longest repeated n-gram, ``<unk>`` share, exact and near loops."""

from .calibrate import HumanRate, LoopCalibration, Margins, calibrate_loop_settings, human_rates, human_scores
from .compress import lz_pieces, tail_compression
from .degeneracy import LoopMeasures, LoopSettings, degeneracy_metrics, measure_loops
from .loop import DEFAULT_MIN_TAIL, LoopInfo, detect_loop, periodic_tail_length
from .nearloop import NearLoopInfo, detect_near_loop, match_share
from .ngrams import distinct_n, longest_repeated_ngram, ngrams, seq_rep_n, unk_share
from .stats import wilson_interval

__all__ = [
    "HumanRate",
    "LoopCalibration",
    "Margins",
    "calibrate_loop_settings",
    "human_rates",
    "human_scores",
    "DEFAULT_MIN_TAIL",
    "LoopInfo",
    "LoopMeasures",
    "LoopSettings",
    "NearLoopInfo",
    "degeneracy_metrics",
    "detect_loop",
    "detect_near_loop",
    "distinct_n",
    "longest_repeated_ngram",
    "lz_pieces",
    "match_share",
    "measure_loops",
    "ngrams",
    "periodic_tail_length",
    "seq_rep_n",
    "tail_compression",
    "unk_share",
    "wilson_interval",
]
