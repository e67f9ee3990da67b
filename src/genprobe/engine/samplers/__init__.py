"""The sampler chain: pure functions of logits, validated parameters, an explicit order and engine.

Stages map logits (B, V) to logits (B, V); a removed token gets ``-inf``, never 0. The **adjustments** (bans,
repetition/presence/frequency penalties, no-repeat-n-gram, DRY) come first in every order and also apply when greedy;
``order`` places the **truncations** (top-n-σ, top-k, typical-p, top-p, min-p, XTC) and **temperature**
(:data:`ORDERS`: genprobe's default ``trunc_then_temp`` keeps a set that does not depend on τ, as llama.cpp's order
does; ``temp_then_trunc``; and the ``hf``, ``vllm`` and ``llama.cpp`` engines' own orders).

``engine`` decides each stage's arithmetic and each penalty's scope (each stage's docstring in :mod:`.stages` says
how): ``hf`` (transformers' processors and warpers, op for op), ``vllm`` (its PyTorch sampler), ``llama.cpp`` (its
float32 candidate-array samplers; penalties over the last 64 tokens) or ``genprobe`` (exact: float64 nucleus mass,
ties to the lower id). It defaults to the order's name when that is an engine, else ``genprobe``.
``SamplerConfig.preset(name, **overrides)`` gives an engine's own defaults (:data:`PRESETS`, sources cited there) with
its order and arithmetic; a bare ``SamplerConfig(order="llama.cpp", top_p=0.9)`` uses llama.cpp's arithmetic and
order but only the parameters given.

Greedy is its own path: the argmax of the adjusted logits, never emulated with τ≈0. NaN logits raise ValueError in
every path.

Modules (one concept each)::

    stages      one class per sampler (its fields, validation, CLI flags, each engine's arithmetic, its
                vLLM / llama.cpp form), ORDERS, and SamplerConfig with the engines' presets
    chain       process_logits, sample_next and friends: the stages in order
    candidates  llama.cpp's float32 candidate array
    dry         llama.cpp's DRY matching and sequence breakers
    cmath       C's expf / logf, as llama.cpp's samplers call them (numpy's float32 ones differ by an ulp)
"""
