"""Serving: every deployment (vLLM, llama.cpp, a live endpoint) through the Backend protocol.

verify-serving (:mod:`.verify`, judged by :mod:`.judge`), loop scans through vLLM (:mod:`.scan`, which also maps
the samplers exactly or refuses them), the online loop monitor (:mod:`.monitor`, :mod:`.vllm_monitor`), and the
adapters (:mod:`.engine` for vLLM, :mod:`.endpoint`, :mod:`.llamacpp`). vLLM is optional (``genprobe[vllm]``):
nothing imports it until an engine is needed (:func:`.engine.require_vllm`).
"""
