"""Forward hooks that are always removed: activation capture and direction ablation.

Both are context managers; hooks are registered on entry and removed in ``finally`` — also when
the body raises — so a model never keeps a stale hook (checked by the tests).
"""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import torch

from ..model.arch import mlp_sites

KINDS = ("mlp_out", "resid", "units")


def _first(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, (tuple, list)) else out


@dataclass
class Captured:
    """Per layer and kind, the tensors seen by the hooks, one entry per forward call."""

    data: dict[str, dict[int, list[torch.Tensor]]] = field(default_factory=dict)

    def get(self, kind: str, layer: int) -> list[torch.Tensor]:
        """Tensors (B, T, D) captured for ``kind`` at ``layer``, in call order."""
        return self.data.get(kind, {}).get(layer, [])


@contextlib.contextmanager
def capture(
    model: Any,
    layers: list[int] | None = None,
    kinds: tuple[str, ...] = ("mlp_out",),
) -> Iterator[Captured]:
    """Record ``mlp_out`` (MLP output added to the residual), ``resid`` (block output) and/or
    ``units`` (input of the down-projection: post-activation unit values) per layer."""
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ValueError(f"unknown capture kinds {bad}; choose from {KINDS}")
    sites = mlp_sites(model)
    layers = list(range(len(sites))) if layers is None else list(layers)
    _check_layers(layers, len(sites))
    cap = Captured({k: {layer: [] for layer in layers} for k in kinds})

    def store(kind: str, layer: int, t: torch.Tensor) -> None:
        cap.data[kind][layer].append(t.detach().clone())

    handles = []
    try:
        for layer, kind in itertools.product(layers, kinds):
            s = sites[layer]
            if kind == "units":  # the down-projection's input: a pre-hook
                handles.append(s.down.register_forward_pre_hook(lambda m, i, k=kind, n=layer: store(k, n, i[0])))
            else:
                module = s.mlp if kind == "mlp_out" else s.block
                handles.append(module.register_forward_hook(lambda m, i, o, k=kind, n=layer: store(k, n, _first(o))))
        yield cap
    finally:
        for h in handles:
            h.remove()


def _check_layers(layers: Iterable[int], n_layers: int) -> None:
    for layer in layers:
        if not 0 <= layer < n_layers:
            raise ValueError(f"layer {layer} out of range: the model has {n_layers} layers")


def remove_direction(h: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """h − (h·d) d for a unit vector d, over the last dimension."""
    d = d.to(dtype=h.dtype, device=h.device)
    return h - (h @ d)[..., None] * d


@contextlib.contextmanager
def ablate(model: Any, directions: dict[int, torch.Tensor]) -> Iterator[None]:
    """While active, each listed layer's MLP output loses its component along that layer's direction."""
    sites = mlp_sites(model)
    handles = []
    try:
        _check_layers(directions, len(sites))
        for layer, d in directions.items():
            d = d / d.norm()

            def hook(m, i, o, d=d):
                if isinstance(o, (tuple, list)):
                    return (remove_direction(o[0], d), *o[1:])
                return remove_direction(o, d)

            handles.append(sites[layer].mlp.register_forward_hook(hook))
        yield
    finally:
        for h in handles:
            h.remove()
