"""llama.cpp as an engine (optional extra ``genprobe[llamacpp]``): nothing here imports the bindings until needed.

The engine and its Backend adapter (:mod:`.engine`), verify-serving's llama.cpp run (:mod:`.verify`), the loop scan
(:mod:`.scan`), the sampler chain (:mod:`.sampling`) and the quantization study (:mod:`.quantize`,
:mod:`.quant_study`, :mod:`.quant_report`).
"""
