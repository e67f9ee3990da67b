"""The experiments of the chapter 《训练与推理的两副面孔》 ("The two faces of training and inference"), as functions
returning typed results; their ``to_dict()`` forms are the keys of ``ch3_case.json``."""

from .case import CASE_KEYS, model_summary, run_case
from .decoding import STRATEGIES, run_decoding
from .exposure import run_exposure
from .sampling import run_sampling
from .timing import run_cache_scaling, run_cache_timing

__all__ = [
    "CASE_KEYS",
    "STRATEGIES",
    "model_summary",
    "run_cache_scaling",
    "run_cache_timing",
    "run_case",
    "run_decoding",
    "run_exposure",
    "run_sampling",
]
