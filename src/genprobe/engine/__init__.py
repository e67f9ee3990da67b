"""Inference engine: KV cache, forward_step, sampler chain and generation loops."""
