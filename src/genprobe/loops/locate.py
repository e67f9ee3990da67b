"""Locate: ablate each layer's loop direction from its MLP output during generation; rank layers."""

from __future__ import annotations

from typing import Any, Callable

import torch

from .hooks import ablate


def locate_layers(
    model: Any,
    directions: dict[int, torch.Tensor],
    loop_rate_of: Callable[[Any], float],
    *,
    include_all: bool = True,
) -> dict:
    """Loop rate with no ablation, with each single layer ablated, and (optionally) all at once.

    ``loop_rate_of(model)`` runs the scan; layers are ranked by loop-rate reduction (largest first).
    """
    base = loop_rate_of(model)
    per_layer = []
    for l, d in sorted(directions.items()):
        with ablate(model, {l: d}):
            rate = loop_rate_of(model)
        per_layer.append({"layer": l, "loop_rate": rate, "reduction": base - rate})
    out = {"base_loop_rate": base, "per_layer": per_layer}
    out["ranking"] = [r["layer"] for r in sorted(per_layer, key=lambda r: (-r["reduction"], r["layer"]))]
    if include_all and len(directions) > 1:
        with ablate(model, dict(directions)):
            rate = loop_rate_of(model)
        out["all_layers"] = {"layers": sorted(directions), "loop_rate": rate, "reduction": base - rate}
    return out
