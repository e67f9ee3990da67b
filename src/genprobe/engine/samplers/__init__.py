"""The sampler chain, one concept per module (see :mod:`genprobe.engine.sampling` for the overview).

config      SamplerConfig, orders, engines, presets
penalties   bans, repetition / presence / frequency penalties, no-repeat-n-gram
dry         llama.cpp's DRY
xtc         llama.cpp's XTC
truncation  temperature, top-k, top-p, min-p, typical-p, top-n-σ (genprobe / HF / vLLM arithmetic)
llamacpp    the same stages on llama.cpp's float32 candidate array
cmath       C's expf / logf, as llama.cpp's samplers call them (numpy's float32 ones differ by an ulp)
chain       process_logits, sample_next and friends
"""

from .chain import (
    adjust_logits,
    check_logits,
    kept_set_size,
    kept_set_sizes,
    process_logits,
    run_stages,
    sample_next,
    sampling_probs,
)
from .config import ENGINES, ORDERS, PRESETS, SamplerConfig, SamplingParams
from .dry import DEFAULT_BREAKERS, breakers_from_strings, dry_penalties, tokenizer_breakers
from .penalties import no_repeat_ngram_mask
from .truncation import top_p_genprobe as top_p_filter

__all__ = [
    "DEFAULT_BREAKERS",
    "ENGINES",
    "ORDERS",
    "PRESETS",
    "SamplerConfig",
    "SamplingParams",
    "adjust_logits",
    "breakers_from_strings",
    "check_logits",
    "dry_penalties",
    "kept_set_size",
    "kept_set_sizes",
    "no_repeat_ngram_mask",
    "process_logits",
    "run_stages",
    "sample_next",
    "sampling_probs",
    "tokenizer_breakers",
    "top_p_filter",
]
