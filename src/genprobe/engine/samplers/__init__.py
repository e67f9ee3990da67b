"""The sampler chain (overview: :mod:`.chain`). One concept per module: ``stages`` (one class per sampler, ORDERS,
SamplerConfig and the engines' presets), ``chain`` (the stages in order), ``candidates`` (llama.cpp's float32
candidate array), ``dry`` (llama.cpp's DRY matching), ``cmath`` (C's ``expf``/``logf`` as llama.cpp calls them)."""
