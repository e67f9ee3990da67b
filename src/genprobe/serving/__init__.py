"""Serving engines (vLLM): verify a deployment against recomputation, scan loops at scale, monitor loops online.

vLLM is optional (``pip install 'genprobe[vllm]'``); nothing here imports it until an engine is
needed, and then a missing install is reported as what to install
(:class:`~genprobe.serving._vllm.VLLMNotAvailableError`).

- :mod:`.engine` — :class:`EngineOptions`, the one shared engine per process (:func:`shared_engine`) and
  ``VllmBackend``, the engine behind the :class:`~genprobe.engine.backend.Backend` protocol
- :mod:`.verify` — ``genprobe verify-serving``: one verifier, every backend (vLLM, llama.cpp, a live endpoint)
- :mod:`.judge` — how a response is judged against float32 recomputation (absolute scale, or a gap ratio)
- :mod:`.endpoint` — a live OpenAI-compatible server as a ``Backend``
- :mod:`.sampling` — :func:`to_sampling_params`: ``SamplerConfig`` → ``SamplingParams``, exact or refused
- :mod:`.scan` — :func:`vllm_batches` / :func:`vllm_scan_backend`: ``loops scan --backend vllm`` through
  ``LLM.generate``, every sampler checked for an exact vLLM form before the engine starts
- :mod:`.monitor` — incremental loop detectors, the monitor over any Backend, ``transformers`` hooks
- :mod:`.vllm_monitor` — the same monitor as a vLLM V1 logits-processor plug-in
- :mod:`.rates` — does a served (patched) model give the loop rates our engine measured?
"""

from ._vllm import INSTALL_HINT, VLLMNotAvailableError, require_vllm, vllm_import_problem
from .engine import EngineOptions, ServingEngine, shared_engine, shutdown_shared_engine
from .sampling import UnsupportedSamplerError, sampling_kwargs, to_sampling_params

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
