"""Reduced precision is not a bug: one rule that judges every reduced-precision deployment, whatever the engine.

A deployment in bfloat16 (vLLM), float16, or a quantized GGUF file (llama.cpp) cannot match float32 recomputation to
float noise: its own arithmetic moves log-probabilities by far more (SmolLM2 in bfloat16: top-5 |Δ log p| up to ~1
on a few positions, top-1 flips at near-ties). Judged on verify-cache's absolute scale, every such deployment would
be "broken", and a real fault drowned in the same numbers. So a reduced-precision phase is judged on a **gap
ratio**, the same for every engine:

    ratio = gap(served, float32) / floor,  floor = gap(the same precision computed honestly, float32)

* the *gap* of a request is the mean |Δ log p| to float32 recomputation over the ids the engine returned at each
  of its positions;
* the *floor* is the same statistic, on the same positions and ids, of an honest computation at the deployment's
  precision: the same model recomputed in the deployment's dtype (``transformers`` / genprobe's engine in bfloat16,
  for vLLM), or llama.cpp's own one-call prefill of the same tokens for a quantized GGUF file
  (:mod:`genprobe.serving.llamacpp.verify`) — how far that precision moves these very tokens, measured on the day;
* ratio ≤ :data:`GAP_PASS` pass, ≤ :data:`GAP_BUG` suspicious, more a bug. Through vLLM a phase's ratio is its
  worst request's (each request over its own floor: a fault confined to one request is not averaged away); through
  llama.cpp, the phase's positions together.

The float32 distances (max |Δ log p|, top-1 agreement) are reported beside the verdict as information. A cache
serving another prompt's entries, shifted positions or other weights move a phase by many floors; an engine error
smaller than the precision's own noise can only be seen on a float32 deployment, which is why verify-serving keeps
float32 as its engine-correctness check.
"""

from __future__ import annotations

GAP_PASS, GAP_BUG = 2.0, 5.0  # a phase's gap over its precision's floor: up to 2 floors pass, over 5 is a bug


def gap_verdict(gap: float, floor: float, noise: float) -> tuple[str, float]:
    """(verdict, ratio) of a reduced-precision phase: ``gap`` over ``floor`` (at least ``noise``, so that a precision
    that happens to be exact on these tokens does not turn float noise into a bug)."""
    ratio = gap / max(floor, noise)
    return ("pass" if ratio <= GAP_PASS else "suspicious" if ratio <= GAP_BUG else "bug"), ratio
