"""The edit search under regression limits: exhaustive over the grid (:func:`run_search`), or scaled with depth
(rank layers, screen strengths by a :class:`LoopProbe`'s teacher-forced proxy, then halve:
docs/loop-repair-at-scale.md).

Every candidate is applied in place, evaluated and reverted exactly. The search minimises the **degenerate rate**
(exact loop, near loop or repetitive tail), so an edit that turns exact loops into near ones does not win. The
choice rule (:func:`choose`): among candidates with KL ≤ ``max_kl``, Δloss ≤ ``max_dloss`` and a degenerate rate
strictly below the baseline's, the lowest; ties go to the lower periodic rate, the lower exact rate, fewer weights
changed, then lower KL.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.nn.functional as F

from .._io import json_safe
from ..metrics.degeneracy import LoopMeasures
from ..model.arch import state_sha256
from .contrast import ablate, position_labels
from .patch import EditSpec, Patch, written
from .regress import FrozenPrefix, Regression, RegressionProbe, forward_logits, pad_right
from .scan import GenerationRecord, progress_bar


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
        """Loop rates on the full set estimated from the two strata, each weighted by its share of the full set (a
        new loop among the controls counts as much as it would in the natural mix of prompts)."""
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
    screen: dict | None = None  # the scaled search's teacher-forced measures (see :func:`screen`)

    @classmethod
    def of(
        cls, spec: EditSpec, patch: Patch, regression: Regression | None, objective: Objective | None = None
    ) -> "Candidate":
        """An evaluated edit with what its patch touches."""
        ts = patch.targets
        alphas, columns = {t.layer: t.alpha for t in ts}, {t.layer: t.columns.tolist() for t in ts}
        return cls(spec, regression, objective, sum(t.changed for t in ts), alphas, columns)

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
    """Evaluate every spec's patch with ``evaluate(model) -> (regression, objective or None)`` on the edited model."""
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


# ---- the scaled search: loop probe, then 1. rank, 2. layer sets, 3. screen, 4. halve ------------
@dataclass(frozen=True)
class Pressure:
    """An edited model's pull toward the loops of the probe's sequences, against the unedited model's."""

    dlogp: float  # mean change of log p(loop token) at loop positions, nats (negative: the loop is less likely)
    broken: float  # share of loop positions whose loop token was the top choice and no longer is
    positions: int


class LoopProbe:
    """Teacher-forced loop continuations of up to ``max_seqs`` looping records, read as one batch."""

    def __init__(self, model: Any, records: Sequence[GenerationRecord], max_seqs: int = 8, reuse_prefix: bool = False):
        rows: list[int] = []
        cols: list[int] = []
        seqs: list[list[int]] = []
        for rec in records:
            seq = list(rec.prompt_ids) + list(rec.tokens)
            loop, _ = position_labels(len(rec.prompt_ids), len(seq), rec.measures)
            if not loop:
                continue  # a repetitive tail without a period: no position is "inside the loop"
            rows.extend([len(seqs)] * len(loop))
            cols.extend(loop)
            seqs.append(seq)
            if len(seqs) == max_seqs:
                break
        if not seqs:
            raise ValueError(
                "the scaled search needs looping generations with an onset (exact or near loops) in the search set "
                "and none has one (their tails are only repetitive): use the exhaustive search (--search exhaustive)"
            )
        self.ids, self.valid = pad_right(seqs)
        self.rows, self.cols = torch.tensor(rows), torch.tensor(cols)
        self.targets = self.ids[self.rows, self.cols + 1]
        self.prefix = FrozenPrefix(model, reuse_prefix)
        with self.prefix.recording():
            self.base_logp, self.base_top = self._read(model)

    @property
    def n_sequences(self) -> int:
        return int(self.ids.shape[0])

    @torch.no_grad()
    def _read(self, model: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """log p(loop token) and whether it is the argmax, at every loop position."""
        logits = forward_logits(model, self.ids, None if bool(self.valid.all()) else self.valid)
        at = logits[self.rows, self.cols].float()
        return F.log_softmax(at, dim=-1).gather(-1, self.targets[:, None])[:, 0], at.argmax(-1) == self.targets

    def measure(self, model: Any, first_layer: int = 0) -> Pressure:
        """The edited (or hooked) model's :class:`Pressure`; ``first_layer``: the lowest layer the edit touches (with
        ``reuse_prefix`` the blocks below it are not computed again)."""
        with self.prefix.skipping(first_layer):
            logp, top = self._read(model)
        was_top = self.base_top
        broken = float((was_top & ~top).sum()) / max(1, int(was_top.sum()))
        return Pressure(float((logp - self.base_logp).mean()), broken, int(logp.numel()))


@dataclass(frozen=True)
class LayerScore:
    """One layer's loop pressure with its direction ablated (rank 1 = the largest drop)."""

    layer: int
    dlogp: float
    broken: float


@dataclass
class Rung:
    """One halving round: how many search prompts each candidate had generated for, and who went on."""

    prone: int
    control: int
    candidates: int
    kept: int


@dataclass
class ScaledTrace:
    """What the scaled search did at each step (``repair.json`` under ``search.scaled``)."""

    layer_scores: list[LayerScore]
    layer_sets: list[tuple[int, ...]]
    screened: int
    admissible_screened: int
    shortlisted: int
    rungs: list[Rung]
    probe_sequences: int
    probe_positions: int
    screen_windows: int
    timings_s: dict[str, float] = field(default_factory=dict)

    JSON_PROPERTIES = ("ranking",)

    @property
    def ranking(self) -> list[int]:
        """Layers, best first."""
        return [s.layer for s in self.layer_scores]


# ---- 1. rank ----------------------------------------------------------------------------------
def rank_layers(
    model: Any, directions: dict[int, torch.Tensor], probe: LoopProbe, progress: bool = False
) -> list[LayerScore]:
    """Each layer's direction ablated alone; layers sorted by loop-pressure drop (largest first, then index)."""
    scores = []
    for layer in progress_bar(sorted(directions), "rank layers", "layer", progress):
        with ablate(model, {layer: directions[layer]}):
            p = probe.measure(model, first_layer=layer)
        scores.append(LayerScore(layer, p.dlogp, p.broken))
    return sorted(scores, key=lambda s: (s.dlogp, s.layer))


def scaled_layer_sets(ranking: Sequence[int], n_layers: int, top: int) -> list[tuple[int, ...]]:
    """The ``top`` best layers alone, the best 2 and the best ``top`` together, and all layers (no duplicates)."""
    best = list(ranking[:top])  # top >= 1: RepairConfig refuses fewer
    sets: list[tuple[int, ...]] = [(layer,) for layer in best]
    sets += [tuple(sorted(best[:j])) for j in sorted({2, len(best)}) if 1 < j <= len(best)]
    if n_layers > 1:
        sets.append(tuple(range(n_layers)))
    return list(dict.fromkeys(sets))


# ---- 3. screen --------------------------------------------------------------------------------
def chains(
    layer_sets: Sequence[tuple[int, ...]],
    ks: Sequence[int],
    forms: Sequence[str],
    alphas: Mapping[str, Sequence[float]],
) -> list[list[EditSpec]]:
    """The grid's edits per (layer set, form, k), strongest first: the chains :func:`screen` walks down."""
    combos = itertools.product(layer_sets, forms, ks)
    return [sorted(grid([ls], [k], [f], alphas), key=lambda s: -s.alpha) for ls, f, k in combos]


def screen(
    model: Any,
    chains: Sequence[Sequence[EditSpec]],
    build: Build,
    regression: RegressionProbe,
    loops: LoopProbe,
    limits: Limits,
    progress: bool = False,
    per_chain: int = 2,
) -> list[Candidate]:
    """Each chain (strongest first): the regression check until one is within the limits, then the loop pressure
    (in ``Candidate.screen``) of it and the next ``per_chain - 1`` weaker ones."""
    out: list[Candidate] = []
    windows = {"windows": int(regression.ids.shape[0])}
    for chain in progress_bar(chains, "screen", "chain", progress):
        admitted = 0
        for spec in chain:
            try:
                patch = build(spec)
            except ValueError as exc:  # e.g. the selected units are never active in loops: no strength builds
                out.append(Candidate(spec, error=str(exc), screen=dict(windows)))
                break
            first = min(spec.layers)
            with written(model, patch):
                cand = Candidate.of(spec, patch, regression.measure(model, first_layer=first))
                ok = limits.admits(cand.regression)
                cand.screen = windows | (json_safe(loops.measure(model, first_layer=first)) if ok else {})
            out.append(cand)
            admitted += ok
            if admitted == per_chain:
                break
    return out


def shortlist(screened: Sequence[Candidate], keep: int) -> list[Candidate]:
    """The ``keep`` admissible candidates whose loop pressure dropped most (ties: lower KL, fewer weights)."""
    ok = [c for c in screened if c.screen and c.screen.get("dlogp", 0.0) < 0]
    assert all(c.regression is not None for c in ok)  # screened and admitted: measured
    ok.sort(key=lambda c: (c.screen["dlogp"], c.regression.kl, c.weights_changed))  # type: ignore
    return ok[:keep]


# ---- 4. successive halving --------------------------------------------------------------------
MIN_RUNG_PRONE = 8  # loop-prone prompts a first rung needs: with fewer, one lucky prompt decides who goes on


def rung_sizes(n_prone: int, n_control: int, candidates: int, min_prone: int = MIN_RUNG_PRONE) -> list[tuple[int, int]]:
    """Prompts per rung, ending on the whole set, each earlier rung half the next while it keeps ``min_prone``
    loop-prone prompts and there are candidates to halve."""
    sizes = [(n_prone, n_control)]
    alive = candidates
    while alive > 2 and sizes[0][0] // 2 >= min_prone:  # the last rung decides between two or more
        sizes.insert(0, (sizes[0][0] // 2, sizes[0][1] // 2))
        alive = math.ceil(alive / 2)
    return sizes


def halve(
    model: Any,
    survivors: Sequence[Candidate],
    build: Build,
    scan: Callable[[Sequence[list[int]]], list[LoopMeasures]],  # prompt ids -> measures on the model as it is now
    prone_ids: Sequence[list[int]],
    control_ids: Sequence[list[int]],
    strata: Strata,
    full_check: Callable[[Candidate], bool],
    progress: bool = False,
) -> tuple[list[Candidate], list[Rung]]:
    """Successive halving on the search set; returns the last rung's candidates and the rungs. Only candidates that
    pass ``full_check`` (the regression check on every validation window) go on or generate at the last rung: a
    rung must not be won by an edit that can never be chosen."""
    alive = list(survivors)
    # loop measures each candidate has generated so far, per stratum (prone, control), in prompt order
    done: dict[int, tuple[list[LoopMeasures], list[LoopMeasures]]] = {id(c): ([], []) for c in alive}
    rungs: list[Rung] = []
    sizes = rung_sizes(len(prone_ids), len(control_ids), len(alive))
    for r, (n_p, n_c) in enumerate(sizes):
        last = r == len(sizes) - 1
        if last:  # only edits that can be chosen generate for the whole set (checked once, when they were kept)
            alive = [c for c in alive if full_check(c)]
        for c in progress_bar(alive, f"halving {r + 1}/{len(sizes)}", "edit", progress):
            prone, control = done[id(c)]
            need_p, need_c = list(prone_ids[len(prone) : n_p]), list(control_ids[len(control) : n_c])
            with written(model, build(c.spec)):
                new = scan(need_p + need_c) if need_p or need_c else []
            prone += new[: len(need_p)]
            control += new[len(need_p) :]
            c.objective = Strata(n_p, n_c, strata.prone_all, strata.control_all).objective(prone[:n_p], control[:n_c])
        n_keep = len(alive) if last else max(1, math.ceil(len(alive) / 2))
        kept = [c for c in sorted(alive, key=rank_key) if full_check(c)][:n_keep]
        rungs.append(Rung(n_p, n_c, len(alive), len(kept)))
        alive = kept
    return alive, rungs


def full_regression_check(
    model: Any, build: Build, measure: Callable[[Any], Regression], limits: Limits
) -> Callable[[Candidate], bool]:
    """``candidate -> within the limits`` on the full regression check, measured once (``screen["full_check"]``)."""

    def check(c: Candidate) -> bool:
        if c.screen is None or "full_check" not in c.screen:
            with written(model, build(c.spec)):
                c.regression = measure(model)
            c.screen = {**(c.screen or {}), "full_check": limits.admits(c.regression)}
        return bool(c.screen["full_check"])

    return check
