"""Inference engine: KV cache, forward_step, sampler chain and generation loops."""

from ..model.cache_protocol import CacheLike
from .cache import KVCache
from .fast.static_cache import StaticKVCache
from .generate import generate
from .runner import GenerationResult
from .samplers import SamplerConfig, kept_set_size, process_logits, sample_next
from .step import forward_step

__all__ = [
    "CacheLike",
    "KVCache",
    "StaticKVCache",
    "forward_step",
    "generate",
    "GenerationResult",
    "SamplerConfig",
    "kept_set_size",
    "process_logits",
    "sample_next",
]
