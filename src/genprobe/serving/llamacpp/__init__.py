"""llama.cpp as an engine (optional extra ``genprobe[llamacpp]``): nothing here imports the bindings until needed.

- :mod:`._bindings` — :func:`require_llama_cpp`, the install hint, :func:`llama_cpp_problem` for skips
- :mod:`.engine` — ``LlamaCppModel``: a GGUF file in llama.cpp (logits at every position from a fresh cache,
  greedy / picker-driven generation, several sequences in one context, the KV-cache primitives), and
  ``LlamaCppBackend``, the same behind the ``Backend`` protocol
- :mod:`.verify` — ``verify_serving_llamacpp`` (``verify-serving --backend llama.cpp``): the one verifier on
  llama.cpp, plus its context-shift phase
- :mod:`.scan` — ``llamacpp_batches`` and the ``loops scan --backend llama.cpp`` backend
- :mod:`.sampling` — a ``SamplerConfig`` as llama.cpp's own sampler chain (exact or refused):
  ``chain_candidates`` (what the chain keeps of one row after a history), ``LlamaCppSampler`` (accept / sample,
  for the scan backend), ``LlamaVocab`` (a GGUF's vocabulary, which DRY needs)
- :mod:`.quantize` — a transformers directory → F32 GGUF (llama.cpp's converter) → each type (its quantize API),
  with what llama.cpp actually wrote per tensor
- :mod:`.quant_measures` — the study's pure measures: KL / top-1 / perplexity, first greedy divergence, loop
  outcomes with the paired sign test
- :mod:`.quant_study` — ``genprobe quant-compare``: every type beside the F32 GGUF in llama.cpp (KL, top-1,
  perplexity, greedy divergence, calibrated loop rates, speed)
- :mod:`.quant_report` — the study's findings and markdown table, its JSON / markdown files written, read, merged
"""

from ._bindings import (
    INSTALL_HINT,
    LLAMA_CPP_PYTHON_VERSION,
    LlamaCppNotAvailableError,
    llama_cpp_problem,
    require_llama_cpp,
)

__all__ = [
    "INSTALL_HINT",
    "LLAMA_CPP_PYTHON_VERSION",
    "LlamaCppNotAvailableError",
    "llama_cpp_problem",
    "require_llama_cpp",
]
