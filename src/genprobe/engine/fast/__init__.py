"""The fast decode path: ONE runner (:class:`~genprobe.engine.fast.compiled.CompiledGPTRunner`) behind the engine's
:class:`~genprobe.engine.runner.Runner` protocol, and everything only it uses.

- :mod:`.compiled`: the runner; decode steps through ``torch.compile`` (a compiled ``while_loop``, a compiled
  step, a compiled prefill), chosen per shape;
- :mod:`.aot`: the same forward exported and compiled ahead of time by AOTInductor, driven by a C++ loop;
- :mod:`.static_cache`: the fixed-shape KV cache both compile against;
- :mod:`.kernels`: hand-written C++ small-M linear kernels and the C++ greedy loop, built on first use, and the
  Inductor pass that puts them into compiled graphs.

:func:`generate(..., compile=True) <genprobe.engine.generate.generate>` selects the runner through
:func:`compiled_runner`; nothing else in the engine knows what is behind it. The eager :class:`GPTRunner
<genprobe.engine.runner.GPTRunner>` and ``GPT.forward`` are the reference every test here compares against.

Importing this package does nothing global. Importing :mod:`.compiled` does nothing global either; the global
effects are all on first use of the compiled path (see :mod:`.compiled` and :mod:`.kernels`): module-registration
hooks installed in ``torch.nn`` (the fingerprint's caches), the kernels' library built and loaded (its operators
registered with torch, a small C shim loaded ``RTLD_GLOBAL``), and, for the duration of each C++ greedy-loop call
only, c10's CPU allocator swapped for a block pool.

``weight_dtype`` (weight-only bfloat16/int8 linear layers, :mod:`genprobe.model.weight_only`) stays in the model
layer: the loader (layer 1) converts the model with one call, ``with_weight_dtype``, and may not import upwards.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from ...model.position_lm import PositionDrivenLM
    from .compiled import CompiledGPTRunner


def compiled_runner(model: "PositionDrivenLM") -> "CompiledGPTRunner":
    """The fast runner of a genprobe GPT or a Llama-family view (one per model: its pooled caches and buffers outlive a
    generation)."""
    from .compiled import CompiledGPTRunner  # torch.compile machinery only when asked for

    return CompiledGPTRunner.for_model(model)


__all__ = ["compiled_runner"]
