"""Locate: ablate each layer's loop direction from its MLP output during generation; rank layers."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch

from .hooks import ablate


@dataclass(frozen=True)
class Ablation:
    """Loop rates with one layer's (or all layers') direction removed; ``reduction`` is in the degenerate rate."""

    layers: tuple[int, ...]
    degenerate_rate: float
    loop_rate: float
    reduction: float


@dataclass
class Located:
    """Baseline rates, one ablation per layer (and all together), layers ranked by any-loop reduction."""

    base_degenerate_rate: float
    base_loop_rate: float
    per_layer: list[Ablation]
    ranking: list[int]
    all_layers: Ablation | None = None
    n_prompts: int = 0

    def to_dict(self) -> dict:
        """Plain JSON."""
        return asdict(self) | {"per_layer": [dict(asdict(a), layer=a.layers[0]) for a in self.per_layer]}


RatesOf = Callable[[Any], tuple[float, float]]  # model -> (degenerate rate, exact loop rate)


def locate_layers(
    model: Any, directions: dict[int, torch.Tensor], rates_of: RatesOf, *, include_all: bool = True
) -> Located:
    """Loop rates with no ablation, with each single layer ablated, and (optionally) all at once.

    ``rates_of(model)`` runs the scan; layers are ranked by the reduction of the degenerate rate (largest first).
    """
    base_deg, base_exact = rates_of(model)

    def ablated(layers: dict[int, torch.Tensor]) -> Ablation:
        with ablate(model, layers):
            a, e = rates_of(model)
        return Ablation(tuple(sorted(layers)), a, e, base_deg - a)

    per_layer = [ablated({layer: d}) for layer, d in sorted(directions.items())]
    ranking = [a.layers[0] for a in sorted(per_layer, key=lambda a: (-a.reduction, a.layers[0]))]
    together = ablated(dict(directions)) if include_all and len(directions) > 1 else None
    return Located(base_deg, base_exact, per_layer, ranking, together)
