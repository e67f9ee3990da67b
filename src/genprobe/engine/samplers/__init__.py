"""The sampler chain: pure functions of logits, validated parameters, an explicit order and engine.

Stages (each maps logits (B, V) → logits (B, V); a removed token gets ``-inf``, never 0):

* **adjustments**, first in every order: bans, repetition penalty, presence/frequency penalties,
  no-repeat-n-gram, DRY. They also apply in greedy mode.
* **truncations**: top-n-σ, top-k, typical-p, top-p, min-p, XTC; and **temperature**.

``order`` places the truncations and temperature (:data:`ORDERS`):

==================  =====================================================================
``trunc_then_temp`` top-n-σ → top-k → typical → top-p → min-p → XTC → τ: the kept set does not
                    depend on τ (genprobe's default; llama.cpp's sampler order)
``temp_then_trunc`` τ first, then the same truncations
``hf``              τ → top-k → top-p → min-p → typical (transformers' warper order)
``vllm``            τ → min-p → top-k → top-p (vLLM's Sampler.sample)
``llama.cpp``       top-n-σ → top-k → typical → top-p → min-p → XTC → τ (common_params_sampling)
==================  =====================================================================

``engine`` decides each stage's arithmetic and each penalty's scope (each stage's docstring in
:mod:`.stages` says how): ``hf`` (transformers' processors and warpers, op for op), ``vllm`` (its PyTorch
sampler), ``llama.cpp`` (its float32 candidate-array samplers; penalties over the last 64 tokens) or
``genprobe`` (exact: float64 nucleus mass, ties to the lower id). It defaults to the order's name when that
is an engine, else ``genprobe``.

**Presets.** ``SamplerConfig.preset(name, **overrides)`` returns the engine's own defaults with its
order and arithmetic; ``order=...`` (or any other field) may be overridden:

* ``preset("hf")``: top_k=50 — ``generate(do_sample=True)`` adds it unless told otherwise
  (transformers GenerationConfig defaults), τ 1, top-p 1;
* ``preset("vllm")``: τ 1, no truncation (SamplingParams defaults);
* ``preset("llama.cpp")``: τ 0.8, top_k 40, top_p 0.95, min_p 0.05, penalty_last_n 64 (common/common.h;
  DRY and XTC off by default: multiplier 0, XTC probability 0);
* ``preset("genprobe")``: plain τ = 1 sampling.

A bare ``SamplerConfig(order="llama.cpp", top_p=0.9)`` uses llama.cpp's arithmetic and order
but only the parameters given.

Greedy is its own path: the argmax of the adjusted logits, never emulated with τ≈0. NaN logits
raise ValueError in every path.

Modules (one concept each)::

    stages      one class per sampler (its fields, validation, CLI flags, each engine's arithmetic, its
                vLLM / llama.cpp form), ORDERS, and SamplerConfig with the engines' presets
    chain       process_logits, sample_next and friends: the stages in order
    candidates  llama.cpp's float32 candidate array
    dry         llama.cpp's DRY matching and sequence breakers
    cmath       C's expf / logf, as llama.cpp's samplers call them (numpy's float32 ones differ by an ulp)
"""

from .chain import adjust_logits, check_logits, kept_set_size, process_logits, sample_next, sampling_probs
from .dry import DEFAULT_BREAKERS, breakers_from_strings, dry_penalties, tokenizer_breakers
from .stages import ENGINES, ORDERS, PRESETS, SamplerConfig, SamplingParams, no_repeat_ngram_mask

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
    "no_repeat_ngram_mask",
    "process_logits",
    "sample_next",
    "sampling_probs",
    "tokenizer_breakers",
]
