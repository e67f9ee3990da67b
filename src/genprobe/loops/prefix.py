"""Reusing the unedited layers' work: an edit of layers ≥ L leaves every block below L computing what it did before.

:class:`FrozenPrefix` records every block's outputs once on the unedited model and replays them (by call order)
while an edit is measured, so the measured forward calls must be the recorded ones; a call past the record raises.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from ..model.arch import mlp_sites


class FrozenPrefix:
    """Per block, its outputs over a fixed sequence of forward calls of the unedited model."""

    def __init__(self, model: Any):
        self.blocks = [s.block for s in mlp_sites(model)]
        self.outputs: list[list[Any]] = [[] for _ in self.blocks]

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        """Record every block's output of the forward calls made inside the block (the unedited model's)."""
        self.outputs = [[] for _ in self.blocks]

        def hook(i: int) -> Any:
            return lambda module, inputs, output: self.outputs[i].append(output)

        handles = [b.register_forward_hook(hook(i)) for i, b in enumerate(self.blocks)]
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    @contextlib.contextmanager
    def skipping(self, first: int) -> Iterator[None]:
        """Blocks below ``first`` replay their recorded outputs instead of computing (the edit starts at ``first``)."""
        saved = []
        try:
            for i, block in enumerate(self.blocks[:first]):
                saved.append((block, block.__dict__.get("forward")))
                block.forward = self._replay(i)
            yield
        finally:
            for block, own in saved:
                if own is None:
                    del block.forward
                else:  # pragma: no cover - a block that already had an instance-level forward (e.g. a wrapper)
                    block.forward = own

    def _replay(self, i: int) -> Any:
        calls = iter(self.outputs[i])

        def forward(*args: Any, **kwargs: Any) -> Any:
            out = next(calls, None)
            if out is None:
                raise RuntimeError(f"block {i} was called more often than recorded: the measured inputs changed")
            return out

        return forward
