"""Strength / layer-set / k / form search under regression limits.

Every candidate is applied in place, evaluated, and reverted exactly (original columns written
back), so the model leaves the search bit-identical. The choice rule is pure (:func:`choose`):
among candidates with KL ≤ ``max_kl`` and Δloss ≤ ``max_dloss`` and a loop rate strictly below the
baseline, take the lowest loop rate; ties go to fewer weights changed, then lower KL.
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from tqdm import tqdm

from .arch import state_sha256
from .edit import EditSpec, make_patch
from .patch import write_values

DEFAULT_MAX_KL = 0.1
DEFAULT_MAX_DLOSS = 0.02


@dataclass(frozen=True)
class Limits:
    """Regression limits an admissible edit must respect (nats)."""

    max_kl: float = DEFAULT_MAX_KL
    max_dloss: float = DEFAULT_MAX_DLOSS

    def admits(self, result: dict) -> bool:
        """True when KL and Δloss are both within the limits."""
        kl, dl = result.get("kl"), result.get("dloss")
        return kl is not None and dl is not None and kl <= self.max_kl and dl <= self.max_dloss


def grid(
    layer_sets: Sequence[Sequence[int]], ks: Sequence[int], forms: Sequence[str], alphas: dict[str, Sequence[float]]
) -> list[EditSpec]:
    """All combinations; ``alphas`` maps each form to its strength grid."""
    out = []
    for form, layers, k in itertools.product(forms, layer_sets, ks):
        if form not in alphas:
            raise ValueError(f"no alpha grid for edit form {form!r}")
        for a in alphas[form]:
            out.append(EditSpec(tuple(layers), int(k), form, float(a)))
    return out


def choose(results: Sequence[dict], base_loop_rate: float, limits: Limits) -> dict | None:
    """The best admissible candidate (see module doc) or ``None`` if none improves within the limits."""
    ok = [r for r in results if limits.admits(r) and r.get("loop_rate") is not None and r["loop_rate"] < base_loop_rate]
    if not ok:
        return None
    return min(ok, key=lambda r: (r["loop_rate"], r["weights_changed"], r["kl"]))


def run_search(
    model: Any,
    specs: Sequence[EditSpec],
    directions: dict[int, torch.Tensor],
    unit_means: dict[int, torch.Tensor],
    evaluate: Callable[[Any], dict],
    *,
    gaps: dict[int, float] | None = None,
    progress: bool = False,
) -> list[dict]:
    """Evaluate every spec: ``evaluate(model)`` must return at least ``loop_rate`` (None = not measured), ``kl``, ``dloss``."""
    before = state_sha256(model)
    results = []
    bar = tqdm(specs, desc="search", unit="edit", file=sys.stderr, disable=not progress or not sys.stderr.isatty(), leave=False)
    for spec in bar:
        try:
            patch = make_patch(model, spec, directions, unit_means, gaps)
        except ValueError as exc:  # e.g. selected units never active in loops: this candidate cannot be built
            results.append({**spec.to_dict(), "error": str(exc), "loop_rate": None, "kl": None, "dloss": None,
                            "weights_changed": 0})
            continue
        write_values(model, patch, "new")
        try:
            r = dict(evaluate(model))
        finally:
            write_values(model, patch, "original")
        r.update(spec.to_dict())
        r["weights_changed"] = sum(t.changed() for t in patch.targets)
        r["alpha_abs"] = {str(t.layer): t.alpha for t in patch.targets}
        r["columns"] = {str(t.layer): t.columns.tolist() for t in patch.targets}
        results.append(r)
    if state_sha256(model) != before:  # pragma: no cover - exact restore
        raise RuntimeError("search left the model modified")
    return results
