"""Column selection and the two edit forms on the MLP down-projection W (d_model × d_ff).

* ``subtract`` (the article's form): W[:, c] ← W[:, c] − α·d   (the loop-repair article cited in :mod:`genprobe.loops`)
* ``project`` (projection removal): W[:, c] ← W[:, c] − α·d·(dᵀW[:, c])   (α = 1 removes it exactly)

``d`` is a unit vector in d_model space — the loop direction measured at that layer's MLP output,
which is exactly W's output space.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .._io import json_safe
from ..model.arch import all_columns, get_columns, mlp_sites
from .patch import Patch, PatchTarget

FORMS = ("subtract", "project")


@dataclass(frozen=True)
class EditSpec:
    """One candidate edit: which layers, how many columns per layer, which form, what strength."""

    layers: tuple[int, ...]
    k: int
    form: str
    alpha: float

    def __post_init__(self) -> None:
        if self.form not in FORMS:
            raise ValueError(f"edit form must be one of {FORMS}, got {self.form!r}")
        if self.k < 1:
            raise ValueError(f"k (columns per layer) must be >= 1, got {self.k}")
        if not self.layers:
            raise ValueError("an edit needs at least one layer")
        if not (self.alpha == self.alpha) or self.alpha < 0:
            raise ValueError(f"alpha must be a finite number >= 0, got {self.alpha}")


def edit_columns(cols: torch.Tensor, d: torch.Tensor, alpha: float, form: str) -> torch.Tensor:
    """New values of columns given as rows ``cols`` (k, d_model) for unit direction ``d``."""
    d = (d / d.norm()).to(cols.dtype)
    if form == "subtract":
        return cols - alpha * d[None, :]
    if form == "project":
        return cols - alpha * (cols @ d)[:, None] * d[None, :]
    raise ValueError(f"edit form must be one of {FORMS}, got {form!r}")


def column_scores(W: torch.Tensor, d: torch.Tensor, unit_mean_in_loops: torch.Tensor) -> torch.Tensor:
    """score_c = |dᵀW[:, c]| × (mean activation of unit c at loop positions), shape (d_ff,), for W's columns as rows
    (:func:`~genprobe.model.arch.all_columns`) and a unit ``d``.

    The mean activation is signed: a unit that is on average negative in loops (GELU's small
    negative lobe, a gated unit) pushes the other way and scores low.
    """
    return (W @ d).abs() * unit_mean_in_loops.float()


def select_columns(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` highest scores, ascending index order (stable, for reproducible patches)."""
    if not 1 <= k <= scores.numel():
        raise ValueError(f"k must be in [1, {scores.numel()}] (d_ff), got {k}")
    return torch.topk(scores, k).indices.sort().values


def make_patch(
    model: Any,
    spec: EditSpec,
    directions: dict[int, torch.Tensor],
    unit_means: dict[int, torch.Tensor],
    gaps: dict[int, float] | None = None,
) -> Patch:
    """Build (do not apply) the patch for ``spec``: selected columns, their original and new values.

    With ``gaps`` (layer -> loop-minus-reference gap of mean MLP output along d), the ``subtract``
    strength is relative: α_abs = α · gap / Σ_{c∈C} mean loop activation of c, so α = 1 removes, at
    an average loop position, the whole gap along d. ``project`` strengths are fractions already.
    """
    sites = mlp_sites(model)
    targets = []
    for layer in spec.layers:
        if not 0 <= layer < len(sites):
            raise ValueError(f"layer {layer} out of range: the model has {len(sites)} layers")
        site, d = sites[layer], directions[layer].float() / directions[layer].float().norm()
        cols = select_columns(column_scores(all_columns(site), d, unit_means[layer]), spec.k)
        orig = get_columns(site, cols)
        alpha = spec.alpha
        if gaps is not None and spec.form == "subtract":
            act = float(unit_means[layer].float()[cols].sum())
            if act <= 0:
                raise ValueError(
                    f"layer {layer}: selected columns have non-positive mean activation {act:.3g}; cannot scale alpha"
                )
            alpha = spec.alpha * gaps[layer] / act
        new = edit_columns(orig.float(), d, alpha, spec.form).to(orig.dtype)
        targets.append(PatchTarget(site.weight_name, layer, site.layout, cols, orig, new, d, float(alpha)))
    return Patch(targets=targets, meta={"edit": json_safe(spec)})
