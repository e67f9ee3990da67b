"""The whole repair pipeline: scan → contrast → direction → locate → search → validate → patch.

:func:`repair` reads top to bottom as its stages; each stage returns a dataclass the next one takes. The three
disjoint prompt sets (direction, search, validate), the degenerate verdict every decision uses and the end-token ban
are described in docs/loop-repair.md ("How the pipeline works").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, Sequence

import torch

from .._io import json_safe
from ..corpus.tokenizer import encode_quiet
from ..engine.samplers.stages import SamplerConfig
from ..metrics.stats import ALPHA, sign_test_p
from ..model.arch import state_sha256
from .contrast import Contrast, ContrastCounts, Separation, ablate, collect_contrast, loop_direction, separation
from .patch import EditSpec, Patch, finalise, make_patch, patched
from .regress import DEFAULT_WINDOW, Regression, RegressionProbe, text_windows
from .scan import EndToken, GenerationRecord, LoopRates, ScanResult, greedy_sampler, summarise
from .search import (
    Build,
    Candidate,
    Limits,
    LoopProbe,
    Objective,
    ScaledTrace,
    Strata,
    chains,
    check_restored,
    choose,
    full_regression_check,
    grid,
    halve,
    rank_layers,
    run_search,
    scaled_layer_sets,
    screen,
    shortlist,
)
from .study import EXHAUSTIVE_MAX, SET_NAMES, Clock, LoopStudy, RepairConfig, RepairInputs


# ---- stage results --------------------------------------------------------------------------
@dataclass
class LayerDirection:
    """One layer's loop direction: the loop gap along it and how it separates loop from reference."""

    layer: int
    vector: torch.Tensor
    gap: float
    separation: Separation
    resid_mean_gap_norm: float
    cos_resid_vs_mlp_direction: float

    def to_dict(self, with_vector: bool = False) -> dict:
        """Plain dict, the separation's measures inline (the vector only on request)."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("vector", "separation")}
        return d | json_safe(self.separation) | ({"vector": self.vector.tolist()} if with_vector else {})


@dataclass
class DirectionStage:
    """Contrast of loop vs reference positions, one direction per layer, and the regression probe."""

    contrast: Contrast
    layers: dict[int, LayerDirection]
    probe: RegressionProbe

    @property
    def directions(self) -> dict[int, torch.Tensor]:
        return {layer: d.vector for layer, d in self.layers.items()}

    def build(self, model: Any) -> Build:
        """``spec -> patch`` of these directions on ``model`` (not applied)."""
        gaps = {layer: d.gap for layer, d in self.layers.items()}
        return lambda spec: make_patch(model, spec, self.directions, self.contrast.unit_mean_loop, gaps)


@dataclass(frozen=True)
class Ablation:
    """Loop rates with one layer's (or all layers') direction removed; ``reduction`` is in the degenerate rate."""

    layers: tuple[int, ...]
    degenerate_rate: float
    loop_rate: float
    reduction: float


@dataclass
class Located:
    """Baseline rates, one ablation per layer (and all together), layers ranked by the degenerate-rate reduction."""

    base_degenerate_rate: float
    base_loop_rate: float
    per_layer: list[Ablation]
    ranking: list[int]
    all_layers: Ablation | None
    n_prompts: int

    def to_dict(self) -> dict:
        """Plain JSON (each per-layer ablation names its layer)."""
        return asdict(self) | {"per_layer": [dict(asdict(a), layer=a.layers[0]) for a in self.per_layer]}


@dataclass
class SearchStage:
    """The stratified search set, the baseline objective, every candidate and the chosen one."""

    strata: Strata
    baseline: Objective
    limits: Limits
    candidates: list[Candidate]
    chosen: Candidate | None
    method: str = "exhaustive"
    grid_size: int = 0  # candidates of the full grid (all of them were evaluated when method is exhaustive)
    scaled: ScaledTrace | None = None

    def to_dict(self) -> dict:
        """The fields, the strata spelled out (``base_loop_rate``: the baseline degenerate rate), the admitted count."""
        s, admissible = self.strata, sum(1 for c in self.candidates if self.limits.admits(c.regression))
        sizes = {"n_prompts": s.prone + s.control, "prone": s.prone, "control": s.control}
        sizes |= {"prone_in_full_set": s.prone_all, "full_set": s.prone_all + s.control_all}
        base = {"base_loop_rate": self.baseline.degenerate_rate, "base_exact_loop_rate": self.baseline.loop_rate}
        rest = {f.name: json_safe(getattr(self, f.name)) for f in fields(self) if f.name != "strata"}
        return sizes | {"objective": "degenerate_rate"} | base | rest | {"admissible": admissible}


@dataclass
class Sample:
    """One loop-prone held-out prompt before and after the edit."""

    prompt: str
    before: str
    after: str
    before_period: int | None
    after_period: int | None
    before_near_period: int | None
    after_near_period: int | None


@dataclass
class Validation:
    """Held-out rates before/after (all prompts and the loop-prone subset), new loops, regression, samples."""

    before: LoopRates
    after: LoopRates
    loop_prone_before: LoopRates
    loop_prone_after: LoopRates
    new_loops: int  # degenerate after the edit on prompts that were not before
    new_exact_loops: int
    regression: Regression
    samples: list[Sample]
    plain_greedy: dict[str, LoopRates] | None = None
    fixed: int = 0  # degenerate before the edit, not after
    p_value: float = 1.0  # two-sided sign test of fixed vs new_loops (metrics.stats.sign_test_p)

    JSON_PROPERTIES = ("significant",)

    @property
    def significant(self) -> bool:
        """The edit ended significantly more degenerations than it started (α = metrics.stats.ALPHA)."""
        return self.fixed > self.new_loops and self.p_value < ALPHA


@dataclass
class Transfer:
    """The edit, searched in one setting (plain prompts or chat turns), measured on held-out prompts in the other."""

    setting: str  # "chat" or "plain": where this was measured
    searched_in: str
    before: LoopRates
    after: LoopRates
    new_loops: int


@dataclass
class RepairReport:
    """Everything a repair run measured (``repair.json``); ``loops locate``'s has no search and the vectors."""

    config: RepairConfig
    sampler: dict
    model: dict
    inputs: dict
    end_token: EndToken
    baseline: dict[str, LoopRates]
    contrast: ContrastCounts
    directions: dict[int, LayerDirection]
    locate: Located | None  # None: the scaled search ranked the layers instead (search.scaled.layer_scores)
    search: SearchStage | None = None
    verdict: str = "located: no edit searched"
    validation: Validation | None = None
    patch: PatchSummary | None = None
    timings_s: dict[str, float] = field(default_factory=dict)
    transfer: Transfer | None = None

    def to_dict(self) -> dict:
        """Plain JSON (direction vectors only when no search ran)."""
        vectors = {str(layer): d.to_dict(with_vector=self.search is None) for layer, d in self.directions.items()}
        return {f.name: json_safe(getattr(self, f.name)) for f in fields(self)} | {"directions": vectors}


# ---- stages ---------------------------------------------------------------------------------
def direction_stage(study: LoopStudy, val_text: str, records: Sequence[GenerationRecord]) -> DirectionStage:
    """Contrast loop vs reference positions of ``records``; one unit direction per layer; the regression probe."""
    # the model's context length, at most DEFAULT_WINDOW tokens (long-context models)
    width = study.cfg.val_window or max(2, min(study.model.max_positions or DEFAULT_WINDOW, DEFAULT_WINDOW))
    windows = text_windows(encode_quiet(study.tokenizer, val_text), width, study.cfg.regression_windows)
    con = collect_contrast(study.module, records, batch_size=study.cfg.batch_size, reference_text_windows=windows[:32])
    layers = {}
    for layer in range(study.n_layers):
        d = loop_direction(con.loop[layer], con.reference[layer], study.cfg.method, study.cfg.seed)
        gap = float((con.loop[layer].mean(0) - con.reference[layer].mean(0)) @ d)
        # how the residual stream after the block separates (reported only)
        rd = con.resid_mean_loop[layer] - con.resid_mean_reference[layer]
        cos = float(rd @ d / rd.norm()) if float(rd.norm()) > 0 else 0.0
        sep = separation(con.loop[layer], con.reference[layer], d)
        layers[layer] = LayerDirection(layer, d, gap, sep, float(rd.norm()), cos)
    probe = RegressionProbe(study.module, windows, batch_size=study.cfg.batch_size)
    return DirectionStage(con, layers, probe)


def _prone_and_control(study: LoopStudy, records: Sequence[GenerationRecord]) -> tuple[list, list]:
    prone = [r for r in records if r.measures.degenerate][: study.cfg.search_prone]
    control = [r for r in records if not r.measures.degenerate][: study.cfg.search_control]
    return prone, control


def locate_stage(study: LoopStudy, stage: DirectionStage, records: Sequence[GenerationRecord], clock: Clock) -> Located:
    """Ablate each layer's direction (then all together) from its MLP output while generating the loop-prone +
    control prompts of the direction set; rank layers by the reduction of the degenerate rate (largest first)."""
    prone, control = _prone_and_control(study, records)
    ids = [r.prompt_ids for r in prone + control]

    def rates() -> tuple[float, float]:
        s = study.scan(ids, decoded=False).summary
        return s.degenerate_rate, s.loop_rate

    base_deg, base_exact = rates()

    def ablated(directions: dict[int, torch.Tensor]) -> Ablation:
        with ablate(study.module, directions):
            deg, exact = rates()
        return Ablation(tuple(sorted(directions)), deg, exact, base_deg - deg)

    per_layer = [ablated({layer: d}) for layer, d in sorted(stage.directions.items())]
    ranking = [a.layers[0] for a in sorted(per_layer, key=lambda a: (-a.reduction, a.layers[0]))]
    together = ablated(stage.directions) if len(stage.directions) > 1 else None
    clock.tick("locate")
    study.log(
        f"locate: base degenerate rate {base_deg:.3f}; ablated: "
        + ", ".join(f"L{a.layers[0]} {a.degenerate_rate:.3f} (exact {a.loop_rate:.3f})" for a in per_layer)
        + f"; ranking {ranking}"
    )
    return Located(base_deg, base_exact, per_layer, ranking, together, len(ids))


def edit_grid(study: LoopStudy) -> list[EditSpec]:
    """Every candidate edit of the configured grid: each layer alone and all together (or ``cfg.layer_sets``)."""
    cfg = study.cfg
    layer_sets = cfg.layer_sets or tuple((layer,) for layer in range(study.n_layers)) + (
        (tuple(range(study.n_layers)),) if study.n_layers > 1 else ()
    )
    return grid(layer_sets, cfg.ks, cfg.forms, cfg.alphas())


def search_method(cfg: RepairConfig, grid_size: int) -> str:
    """``cfg.search``, with ``auto`` resolved: exhaustive up to :data:`EXHAUSTIVE_MAX` candidates, else scaled."""
    if cfg.search != "auto":
        return cfg.search
    return "exhaustive" if grid_size <= EXHAUSTIVE_MAX else "scaled"


def search_stage(study: LoopStudy, stage: DirectionStage, records: Sequence[GenerationRecord]) -> SearchStage:
    """Choose an edit on a stratified search set by the degenerate rate: every edit of the grid (exhaustive), or
    ranked, screened and halved (:mod:`genprobe.loops.search`) when the grid is large or ``cfg.search`` says so."""
    cfg = study.cfg
    prone, control = _prone_and_control(study, records)
    n_prone_all = sum(1 for r in records if r.measures.degenerate)
    strata = Strata(len(prone), len(control), n_prone_all, len(records) - n_prone_all)
    baseline = strata.objective([r.measures for r in prone], [r.measures for r in control])
    limits = Limits(cfg.max_kl, cfg.max_dloss)
    specs = edit_grid(study)
    method = search_method(cfg, len(specs))
    result = SearchStage(strata, baseline, limits, [], None, method=method, grid_size=len(specs))
    if not prone:
        return result
    if method == "scaled":
        result.candidates, finalists, result.scaled = _scaled(study, stage, records, strata, limits)
        result.chosen = choose(finalists, baseline, limits)
        return result
    ids = [r.prompt_ids for r in prone + control]

    def evaluate(model: Any) -> tuple[Regression, Objective | None]:
        reg = stage.probe.measure(model)
        if not cfg.scan_inadmissible and not limits.admits(reg):
            return reg, None
        recs = study.scan(ids, decoded=False).records
        return reg, strata.objective([r.measures for r in recs[: len(prone)]], [r.measures for r in recs[len(prone) :]])

    result.candidates = run_search(study.module, specs, stage.build(study.module), evaluate, progress=study.progress)
    result.chosen = choose(result.candidates, baseline, limits)
    return result


def _scaled(
    study: LoopStudy,
    stage: DirectionStage,
    records: Sequence[GenerationRecord],
    strata: Strata,
    limits: Limits,
) -> tuple[list[Candidate], list[Candidate], ScaledTrace]:
    """Rank → layer sets → screen → halving (see :mod:`genprobe.loops.search`); every candidate, the last rung's."""
    cfg, model, clock = study.cfg, study.module, Clock()
    before = state_sha256(model)
    prone, control = _prone_and_control(study, records)
    # the search set's loops with an onset (exact or near), the evaluated prone prompts first
    looping = sorted((r for r in records if r.measures.any_loop), key=lambda r: not any(r is p for p in prone))
    loops = LoopProbe(model, looping, cfg.screen_sequences, reuse_prefix=True)
    scores = rank_layers(model, stage.directions, loops, study.progress)
    clock.tick("rank")
    study.log(
        "rank (Δ log p(loop token), direction ablated): " + ", ".join(f"L{s.layer} {s.dlogp:+.2f}" for s in scores)
    )
    sets = scaled_layer_sets([s.layer for s in scores], study.n_layers, cfg.top_layers)
    build = stage.build(model)
    windows = stage.probe.ids[: cfg.screen_windows].tolist()
    quick = RegressionProbe(model, windows, batch_size=cfg.batch_size, reuse_prefix=True)
    grid = chains(sets, cfg.ks, cfg.forms, cfg.alphas())
    screened = screen(model, grid, build, quick, loops, limits, study.progress, cfg.screen_strengths)
    clock.tick("screen")
    short, admitted = shortlist(screened, cfg.keep), sum(1 for c in screened if "dlogp" in (c.screen or {}))
    study.log(
        f"screen: {len(screened)} edits of layer sets {sets}, {admitted} within the limits on {len(windows)} windows; "
        f"generating for {len(short)}"
    )
    finalists, rungs = halve(
        model,
        short,
        build,
        lambda ids: [r.measures for r in study.scan(ids, decoded=False).records],
        [r.prompt_ids for r in prone],
        [r.prompt_ids for r in control],
        strata,
        full_regression_check(model, build, stage.probe.measure, limits),
        study.progress,
    )
    clock.tick("halving")
    check_restored(model, before)
    study.log("halving: " + "; ".join(f"{r.prone}+{r.control} prompts, {r.kept} of {r.candidates} kept" for r in rungs))
    screening = (len(screened), admitted, len(short), rungs, loops.n_sequences, loops.targets.numel(), len(windows))
    return screened, finalists, ScaledTrace(scores, sets, *screening, json_safe(clock))


def _new(before: ScanResult, after: ScanResult, verdict: str = "degenerate") -> int:
    """Prompts whose generation has ``verdict`` (a :class:`LoopMeasures` flag) in ``after`` and not in ``before``."""
    pairs = zip(before.records, after.records, strict=True)
    return sum(1 for b, a in pairs if getattr(a.measures, verdict) and not getattr(b.measures, verdict))


def _plain_greedy(study: LoopStudy, ids: list[list[int]]) -> LoopRates | None:
    return study.scan(ids, sampler=greedy_sampler(study.eos_id), decoded=False).summary if ids else None


def validate_stage(
    study: LoopStudy, patch: Patch, before: ScanResult, texts: list[str], probe: RegressionProbe
) -> Validation:
    """Apply the patch, rescan the held-out set (and plain greedy), measure regression, revert exactly."""
    ids = [r.prompt_ids for r in before.records]
    plain_ids = ids[: study.cfg.plain_greedy_check] if study.sampler != greedy_sampler(study.eos_id) else []
    plain_before = _plain_greedy(study, plain_ids)
    with patched(study.module, patch):
        after = study.scan(ids, texts, desc="validate")
        regression = probe.measure(study.module)
        plain_after = _plain_greedy(study, plain_ids)
    pairs = list(zip(before.records, after.records, strict=True))
    prone = [(b, a) for b, a in pairs if b.measures.degenerate]
    samples = [
        Sample(
            b.prompt or "",
            b.text or "",
            a.text or "",
            b.measures.period,
            a.measures.period,
            b.measures.near_period if b.measures.near_looping else None,
            a.measures.near_period if a.measures.near_looping else None,
        )
        for b, a in prone[: study.cfg.samples]
    ]
    fixed, new = _new(after, before), _new(before, after)
    return Validation(
        before.summary,
        after.summary,
        summarise([b for b, _ in prone]),
        summarise([a for _, a in prone]),
        new,
        _new(before, after, "looping"),
        regression,
        samples,
        None if plain_before is None or plain_after is None else {"before": plain_before, "after": plain_after},
        fixed,
        sign_test_p(fixed, new),
    )


def transfer_stage(study: LoopStudy, patch: Patch, texts: Sequence[str], searched_chat: bool) -> Transfer | None:
    """Held-out prompts in the setting the search did not use, before and after the edit (None: no chat template,
    or ``cfg.transfer`` is 0)."""
    if study.model.chat_template is None or study.cfg.transfer == 0 or not texts:
        return None
    ids = study.encode(texts[: study.cfg.transfer], not searched_chat)
    before = study.scan(ids, decoded=False, desc="transfer")
    with patched(study.module, patch):
        after = study.scan(ids, decoded=False, desc="transfer")
    names = ("plain", "chat")
    return Transfer(names[not searched_chat], names[searched_chat], before.summary, after.summary, _new(before, after))


@dataclass(frozen=True)
class PatchSummary:
    """What the chosen patch changes and the model hashes it connects."""

    edit: dict
    weights_changed: int
    total_parameters: int
    fraction_changed: float
    sha256_before: str
    sha256_after: str


# ---- the pipeline ---------------------------------------------------------------------------
def repair(
    model: Any,
    inputs: RepairInputs,
    cfg: RepairConfig | None = None,
    *,
    locate_only: bool = False,
    sampler: SamplerConfig | None = None,
    progress: bool = False,
    log: Callable[[str], None] = lambda msg: None,
) -> tuple[RepairReport, Patch | None]:
    """Run the pipeline on a :class:`genprobe.model.load.Model`; the report and the patch (None if no edit passed).
    ``locate_only`` (``loops locate``): the direction set only, its directions and layer ablations, no edit."""
    study, clock = LoopStudy(model, cfg or RepairConfig(), sampler, progress, log), Clock()
    if study.end_token.banned:
        log(f"note: {study.end_token.note}")
    sets = SET_NAMES[:1] if locate_only else SET_NAMES
    encoded = {k: study.encode(getattr(inputs, k), inputs.chat) for k in sets}
    base = {k: study.scan(encoded[k], getattr(inputs, k), desc=f"scan {k}") for k in sets}
    clock.tick("baseline_scans")
    log(
        "baseline degenerate (exact loop) rates: "
        + ", ".join(f"{k} {v.summary.degenerate_rate:.3f} ({v.summary.loop_rate:.3f})" for k, v in base.items())
    )
    stage = direction_stage(study, inputs.val_text, base["direction"].records)
    clock.tick("contrast_direction")
    # the generation-based locate stage is reported beside the exhaustive search's grid; the scaled search ranks
    # layers itself, teacher-forced, at a fraction of the cost
    exhaustive = search_method(study.cfg, len(edit_grid(study))) == "exhaustive"
    located = locate_stage(study, stage, base["direction"].records, clock) if exhaustive or locate_only else None
    sampled, summaries = json_safe(study.sampler), {k: v.summary for k, v in base.items()}
    report = RepairReport(
        study.cfg,
        sampled,
        study.model.describe(),
        inputs.summary(),
        study.end_token,
        summaries,
        stage.contrast.counts,
        stage.layers,
        located,
    )
    patch = None if locate_only else _search_and_validate(study, stage, base, inputs, report, clock)
    report.timings_s = json_safe(clock)
    return report, patch


def _search_and_validate(
    study: LoopStudy,
    stage: DirectionStage,
    base: dict[str, ScanResult],
    inputs: RepairInputs,
    report: RepairReport,
    clock: Clock,
) -> Patch | None:
    """Search, then validate the chosen edit on the held-out set; its patch when the change is significant."""
    report.search = search = search_stage(study, stage, base["search"].records)
    clock.tick("search")
    if search.chosen is None:
        report.verdict = (
            "no loop-prone prompt in the search set: nothing to repair"
            if search.strata.prone == 0
            else "no edit passed the limits (or none lowered the degenerate rate within them)"
        )
        return None
    report.verdict = "edit passed the limits"
    chosen = search.chosen
    assert chosen.objective is not None and chosen.regression is not None  # choose() returns scanned, admitted ones
    patch = finalise(study.module, stage.build(study.module)(chosen.spec))  # hashes recorded, model left unchanged
    patch.meta.update(
        edit=json_safe(chosen.spec),
        sampler=json_safe(study.sampler),
        objective="degenerate_rate",
        search_degenerate_rate=chosen.objective.degenerate_rate,
        search_loop_rate=chosen.objective.loop_rate,
        kl=chosen.regression.kl,
        dloss=chosen.regression.dloss,
    )
    report.validation = v = validate_stage(study, patch, base["validate"], inputs.validate, stage.probe)
    clock.tick("validate")
    if not v.significant:  # a verdict no larger than its evidence: no patch written
        report.verdict = (
            f"no significant change on the {v.before.n} held-out prompts (degenerate {v.before.degenerate_rate:.3f}"
            f" → {v.after.degenerate_rate:.3f}; {v.fixed} fixed, {v.new_loops} new; sign test p = {v.p_value:.3f})"
            ": no patch"
        )
        return None
    # the JSON's "patch" describes a patch written, from the finalised patch's metadata
    report.patch = PatchSummary(**{f.name: patch.meta[f.name] for f in fields(PatchSummary)})
    report.transfer = transfer_stage(study, patch, inputs.validate, inputs.chat)
    if report.transfer is not None:
        clock.tick("transfer")
    return patch
