"""Inference engine: KV cache, forward_step, sampler chain and generation loops."""

from .cache import KVCache
from .step import forward_step

__all__ = ["KVCache", "forward_step"]
