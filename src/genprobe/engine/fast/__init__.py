"""The fast decode path: ONE runner (:class:`~genprobe.engine.fast.compiled.CompiledGPTRunner`) behind the engine's
:class:`~genprobe.engine.runner.Runner` protocol, and everything only it uses: :mod:`.compiled` (the runner,
``torch.compile``, a whole greedy generation in one or two calls), :mod:`.aot` (the same forward compiled ahead of
time, driven by a C++ loop), :mod:`.static_cache` (the fixed-shape KV cache both compile against) and
:mod:`.kernels` (hand-written C++ kernels and their Inductor pass).

:func:`~genprobe.engine.runner.runner_for` selects the runner (``CompiledGPTRunner.for_model``, one per model); nothing
else in the engine knows what is behind it. Importing this package does nothing global (docs/ARCHITECTURE.md, "One
boundary", lists what first use does).
"""
