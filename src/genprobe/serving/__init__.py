"""Serving: every deployment (vLLM, llama.cpp, a live endpoint) through the Backend protocol.

verify-serving (:mod:`.verify`, judged by :mod:`.judge`), loop scans through vLLM (:mod:`.scan`, samplers mapped
exactly or refused by :mod:`.sampling`), the online loop monitor (:mod:`.monitor`, :mod:`.vllm_monitor`), and the
adapters (:mod:`.engine` for vLLM, :mod:`.endpoint`, :mod:`.llamacpp`). vLLM is optional (``genprobe[vllm]``):
nothing imports it until an engine is needed (:mod:`._vllm`).
"""

from ._vllm import INSTALL_HINT, VLLMNotAvailableError, require_vllm, vllm_import_problem
from .engine import EngineOptions, ServingEngine, shared_engine, shutdown_shared_engine
from .scan import UnsupportedSamplerError, sampling_kwargs, to_sampling_params

__all__ = [
    "INSTALL_HINT",
    "EngineOptions",
    "ServingEngine",
    "UnsupportedSamplerError",
    "VLLMNotAvailableError",
    "require_vllm",
    "sampling_kwargs",
    "shared_engine",
    "shutdown_shared_engine",
    "to_sampling_params",
    "vllm_import_problem",
]
