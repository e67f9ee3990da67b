"""The sampler chain (overview: :mod:`.chain`): ``stages`` (one class per sampler, ORDERS, SamplerConfig and the
engines' presets), ``chain`` (the stages in order), ``llama_cpp`` (llama.cpp's float32 arithmetic: C's
``expf``/``logf``, the candidate array, DRY's matching)."""
