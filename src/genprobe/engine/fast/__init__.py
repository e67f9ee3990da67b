"""The fast decode path: ONE runner (:class:`~genprobe.engine.fast.compiled.CompiledGPTRunner`) behind the engine's
:class:`~genprobe.engine.runner.Runner` protocol, and everything only it uses: :mod:`.compiled` (the runner,
``torch.compile``), :mod:`.aot` (the same forward compiled ahead of time, driven by a C++ loop), :mod:`.greedy`
(a whole greedy generation in one or two calls), :mod:`.static_cache` (the fixed-shape KV cache both compile
against) and :mod:`.kernels` (hand-written C++ kernels and their Inductor pass).

:func:`~genprobe.engine.runner.runner_for` selects the runner through :func:`compiled_runner`; nothing else in the
engine knows what is behind it. Importing this package does nothing global (docs/ARCHITECTURE.md, "One boundary",
lists what first use does).
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
