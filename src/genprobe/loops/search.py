"""Strength / layer-set / k / form search under regression limits, optimising a loop rate that cannot be gamed.

Every candidate is applied in place, evaluated and reverted exactly. The search minimises the **degenerate rate**
(exact loop, near loop or repetitive tail) on a stratified search set; the exact rate is reported but never decides,
so an edit that turns exact loops into near ones does not win. The choice rule (:func:`choose`): among candidates
with KL ≤ ``max_kl``, Δloss ≤ ``max_dloss`` and a degenerate rate strictly below the baseline's, the lowest
degenerate rate; ties go to the lower periodic rate, the lower exact rate, fewer weights changed, then lower KL.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Mapping, Sequence

from .._io import json_safe
from ..metrics.degeneracy import LoopMeasures
from ..model.arch import state_sha256
from .edit import EditSpec
from .patch import Patch, written
from .regress import Regression
from .scan import progress_bar


@dataclass(frozen=True)
class Limits:
    """Regression limits an admissible edit must respect (nats)."""

    max_kl: float = 0.1
    max_dloss: float = 0.02

    def admits(self, reg: Regression | None) -> bool:
        """True when KL and Δloss are both within the limits."""
        return reg is not None and reg.kl <= self.max_kl and reg.dloss <= self.max_dloss


@dataclass(frozen=True)
class Objective:
    """Stratified rates on the search set: ``degenerate_rate`` is minimised, the others are reported."""

    degenerate_rate: float
    any_loop_rate: float
    loop_rate: float
    near_loop_rate: float
    prone_degenerate: int  # loop-prone prompts still degenerate
    control_degenerate: int  # control prompts that degenerate after the edit (new loops)


@dataclass(frozen=True)
class Strata:
    """How the search set was drawn: ``prone``/``control`` prompts of ``prone_all``/``control_all`` in the full set."""

    prone: int
    control: int
    prone_all: int
    control_all: int

    def objective(self, prone: Sequence[LoopMeasures], control: Sequence[LoopMeasures]) -> Objective:
        """Loop rates on the full set estimated from the two strata, each weighted by its share of the full set.

        A new loop among the controls counts as much as it would in the natural mix of prompts.
        """
        if len(prone) != self.prone or len(control) != self.control:
            raise ValueError(
                f"expected {self.prone} loop-prone and {self.control} control measures, "
                f"got {len(prone)} and {len(control)}"
            )
        n = self.prone_all + self.control_all
        w_p = self.prone_all / self.prone if self.prone else 0.0
        w_c = self.control_all / self.control if self.control else 0.0

        def rate(hit: Callable[[LoopMeasures], bool]) -> float:
            return (w_p * sum(map(hit, prone)) + w_c * sum(map(hit, control))) / n if n else 0.0

        return Objective(
            rate(lambda m: m.degenerate),
            rate(lambda m: m.any_loop),
            rate(lambda m: m.looping),
            rate(lambda m: m.near_looping),
            sum(m.degenerate for m in prone),
            sum(m.degenerate for m in control),
        )


@dataclass
class Candidate:
    """One evaluated edit: its spec, what it costs (regression), what it does (objective), what it touches."""

    spec: EditSpec
    regression: Regression | None = None
    objective: Objective | None = None  # None: not scanned (over the limits) or not buildable
    weights_changed: int = 0
    alpha_abs: dict[int, float] = field(default_factory=dict)
    columns: dict[int, list[int]] = field(default_factory=dict)
    error: str | None = None
    screen: dict | None = None  # the scaled search's teacher-forced measures (see genprobe.loops.scaled)

    @classmethod
    def of(
        cls, spec: EditSpec, patch: Patch, regression: Regression | None, objective: Objective | None = None
    ) -> "Candidate":
        """An evaluated edit with what its patch touches."""
        ts = patch.targets
        alphas, columns = {t.layer: t.alpha for t in ts}, {t.layer: t.columns.tolist() for t in ts}
        return cls(spec, regression, objective, sum(t.changed() for t in ts), alphas, columns)

    def to_dict(self) -> dict:
        """Flat JSON row (spec, regression, objective, columns)."""
        reg = {k: getattr(self.regression, k) if self.regression else None for k in ("kl", "dloss", "loss")}
        obj = json_safe(self.objective) if self.objective else dict.fromkeys(f.name for f in fields(Objective))
        rest = ("weights_changed", "alpha_abs", "columns", "error", "screen")
        return json_safe(self.spec) | reg | obj | {k: getattr(self, k) for k in rest}


def grid(
    layer_sets: Sequence[Sequence[int]], ks: Sequence[int], forms: Sequence[str], alphas: Mapping[str, Sequence[float]]
) -> list[EditSpec]:
    """All combinations; ``alphas`` maps each form to its strength grid."""
    missing = [form for form in forms if form not in alphas]
    if missing:
        raise ValueError(f"no alpha grid for edit form {missing[0]!r}")
    combos = itertools.product(forms, layer_sets, ks)
    return [EditSpec(tuple(layers), int(k), form, float(a)) for form, layers, k in combos for a in alphas[form]]


def choose(candidates: Sequence[Candidate], baseline: Objective, limits: Limits) -> Candidate | None:
    """The best admissible candidate (see module doc); ``None`` if none lowers the degenerate rate within the limits."""
    ok = [
        c
        for c in candidates
        if limits.admits(c.regression)
        and c.objective is not None
        and c.objective.degenerate_rate < baseline.degenerate_rate
    ]
    return min(ok, key=rank_key) if ok else None


def rank_key(c: Candidate) -> tuple[float, float, float, int, float]:
    """The order of the choice rule (see module doc): lower is better."""
    assert c.objective is not None and c.regression is not None  # only scanned, admitted candidates are ranked
    o = c.objective
    return (o.degenerate_rate, o.any_loop_rate, o.loop_rate, c.weights_changed, c.regression.kl)


def check_restored(model: Any, before: str) -> None:
    """Raise if the model's weights are not the ones the search started from."""
    if state_sha256(model) != before:  # pragma: no cover - every edit is written back exactly
        raise RuntimeError("the search left the model modified")


Evaluate = Callable[[Any], tuple[Regression, Objective | None]]


Build = Callable[[EditSpec], Patch]  # spec -> its patch (not applied)


def run_search(
    model: Any, specs: Sequence[EditSpec], build: Build, evaluate: Evaluate, progress: bool = False
) -> list[Candidate]:
    """Evaluate every spec's patch (``build(spec)``, e.g. :func:`~genprobe.loops.edit.make_patch` of the directions)
    with ``evaluate(model) -> (regression, objective or None)`` on the edited model."""
    before = state_sha256(model)
    out = []
    for spec in progress_bar(specs, "search", "edit", progress):
        try:
            patch = build(spec)
        except ValueError as exc:  # e.g. selected units never active in loops: this candidate cannot be built
            out.append(Candidate(spec, error=str(exc)))
            continue
        with written(model, patch):
            reg, obj = evaluate(model)
        out.append(Candidate.of(spec, patch, reg, obj))
    check_restored(model, before)
    return out
