"""``loops compare``: which fix for loops? Decode-time samplers beside the directional weight edit, with numbers.

The methods (:data:`METHODS`): decode-time samplers, each differing from its base (greedy, or ``sample`` for XTC) by
one knob, the weight edit, and the edit + best sampler; every method bans the same ids. :func:`compare_fixes` (its
bench's ``run``) reads top to bottom as the stages: generate every method, score loops, legitimate repetition and
fluency, choose the best decode-time method (:data:`BEST_RULE`), time them, classify by sequence breaker
(:data:`CLASSES`: what DRY misses; docs/which-fix.md, "How the comparison works").
"""

from __future__ import annotations

import statistics
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Sequence

from .._io import NOT_JSON, json_safe
from ..engine.generate import generate
from ..engine.samplers.llama_cpp import DEFAULT_BREAKERS, tokenizer_breakers
from ..engine.samplers.stages import SamplerConfig
from ..metrics.degeneracy import LoopMeasures, LoopSettings
from ..metrics.legit import LegitRates, legit_counts, legit_rates
from ..metrics.stats import wilson_interval
from .compare_human import Fluency, HumanTexts, fluency, human_texts, score_continuations
from .patch import Patch, patched
from .scan import EndToken, GenerationRecord, LoopRates, ScanResult, study_sampler
from .study import Clock, LoopStudy, RepairConfig

BACKENDS = ("genprobe",)
BEST_RULE = (
    "best decode-time method = the lowest degenerate rate among the methods (greedy and the edit rows excluded) "
    "that (a) run at >= {min_speed:g}x greedy's tokens/s, (b) write text no more surprising to the judge than the "
    "human texts are (NLL per character under the judge -- the model itself when there is none -- at most the human "
    "texts' NLL under it), and (c) keep >= {min_kept:.0%} of the genre's legitimate repetition (Tang: the lower of "
    "the reduplication and couplet-parallel rates relative to human; other text: the repeated n-gram rate relative "
    "to human); ties go to the lower NLL. A criterion that cannot be measured is skipped (said in 'skipped'). When "
    "no method qualifies, the lowest degenerate rate is chosen and flagged acceptable=false."
)


# ---- the methods ------------------------------------------------------------------------------
EDIT, EDIT_BEST = "edit", "edit+best"
BASELINE = "greedy"
POEM_BREAKERS = ("，", "。")
TEXT_BREAKERS = ("\n", ".", "!", "?")
DRY = {"dry_multiplier": 0.8, "dry_base": 1.75, "dry_allowed_length": 2, "dry_last_n": -1}
SAMPLE = {"temperature": 0.8, "top_p": 0.95}

GREEDY = {"greedy": True}
METHODS: dict[str, tuple[str, dict]] = {  # name -> (label, sampler parameters); the default order
    "greedy": ("greedy (baseline)", GREEDY),
    "sample": ("sampling τ 0.8, top-p 0.95", SAMPLE),
    "rep-1.1": ("repetition penalty 1.1", {**GREEDY, "repetition_penalty": 1.1}),
    "rep-1.2": ("repetition penalty 1.2", {**GREEDY, "repetition_penalty": 1.2}),
    "rep-1.3": ("repetition penalty 1.3", {**GREEDY, "repetition_penalty": 1.3}),
    "no-repeat-3": ("no-repeat 3-gram", {**GREEDY, "no_repeat_ngram": 3}),
    "pres-freq": ("presence 0.5 + frequency 0.5", {**GREEDY, "presence_penalty": 0.5, "frequency_penalty": 0.5}),
    "dry": ("DRY 0.8, default breakers", {**GREEDY, **DRY}),  # + the breakers, tokenized (build_methods)
    "dry-lines": ("DRY 0.8, line breakers", {**GREEDY, **DRY}),
    "xtc": ("sampling + XTC 0.5/0.1", {**SAMPLE, "xtc_probability": 0.5, "xtc_threshold": 0.1}),
    "contrastive": ("contrastive search α 0.6, k 4", {"penalty_alpha": 0.6, "top_k": 4}),
    EDIT: ("weight edit (greedy)", GREEDY),
    EDIT_BEST: ("weight edit + best sampler", {}),  # the best method's sampler (compare_fixes)
}


@dataclass(frozen=True)
class Method:
    """One row of the comparison: a name, its exact sampler (bans included) and whether the patch is applied."""

    name: str
    label: str
    sampler: SamplerConfig
    patched: bool = False


def check_methods(names: Sequence[str] | None, have_patch: bool) -> list[str]:
    """Validated method names, the greedy baseline first; ``None``: every method (the edit rows need a patch)."""
    if names is None:
        names = [n for n in METHODS if have_patch or n not in (EDIT, EDIT_BEST)]
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; choose from {list(METHODS)}")
    dupes = sorted({n for n in names if list(names).count(n) > 1})
    if dupes:
        raise ValueError(f"method(s) listed twice: {dupes}")
    if not have_patch and (EDIT in names or EDIT_BEST in names):
        raise ValueError(f"methods {EDIT!r} and {EDIT_BEST!r} need a loop patch (from `loops repair`); none was given")
    if EDIT_BEST in names and not [n for n in names if n not in (BASELINE, EDIT, EDIT_BEST)]:
        raise ValueError(
            f"{EDIT_BEST!r} needs at least one decode-time method to choose the best from "
            f"(e.g. {', '.join(n for n in METHODS if n not in (BASELINE, EDIT, EDIT_BEST))})"
        )
    return [BASELINE] + [n for n in names if n != BASELINE]


def build_methods(
    names: Sequence[str], tokenizer: Any, ban_ids: Sequence[int], genre: str, engine: str | None = None
) -> list[Method]:
    """The :class:`Method` of every name except ``edit+best`` (built by :func:`compare_fixes`); ``engine`` (a
    :data:`~genprobe.engine.samplers.stages.PRESETS` name): each method as that engine runs it, its defaults under
    the method's own parameters (:meth:`SamplerConfig.preset`); None: genprobe's plain chain."""
    breakers = {"dry": DEFAULT_BREAKERS, "dry-lines": POEM_BREAKERS if genre == "tang" else TEXT_BREAKERS}
    out = []
    for n in (n for n in names if n != EDIT_BEST):
        label, params = METHODS[n]
        if n in breakers:
            params = {**params, "dry_sequence_breakers": tokenizer_breakers(tokenizer, list(breakers[n]))}
        params = {**params, "ban_ids": tuple(ban_ids)}  # a copy: METHODS stays as declared
        sampler = SamplerConfig.preset(engine, **params) if engine else SamplerConfig(**params)
        out.append(Method(n, label, sampler, patched=n == EDIT))
    return out


# ---- loops classified by sequence breaker ----------------------------------------------------
SPANS, WITHIN, NO_LOOP = "spans a breaker", "within a line", "no baseline loop"
CLASSES = (SPANS, WITHIN, NO_LOOP)


def unit_class(text: str, measures: LoopMeasures, breakers: str) -> str:
    """:data:`SPANS`, :data:`WITHIN` or :data:`NO_LOOP` for one generation, by one period of its periodic tail."""
    p = measures.any_period
    if not p:
        return NO_LOOP
    return SPANS if any(ch in breakers for ch in text[-p:]) else WITHIN


@dataclass
class ClassRate:
    """A method's degenerate rate on the prompts of one baseline-loop class."""

    cls: str
    n: int
    degenerate: int
    rate: float | None
    ci95: list[float]


def class_rates(classes: Sequence[str], degenerate: Sequence[bool]) -> list[ClassRate]:
    """Degenerate counts and rates per class (every class listed, empty ones with rate None)."""
    out = []
    for c in CLASSES:
        flags = [d for k, d in zip(classes, degenerate, strict=True) if k == c]
        k = sum(flags)
        out.append(ClassRate(c, len(flags), k, k / len(flags) if flags else None, list(wilson_interval(k, len(flags)))))
    return out


@dataclass
class OwnLoops:
    """A method's own periodic tails (characters), and how many of them have a unit that spans a breaker."""

    JSON_PROPERTIES = ("spanning_share",)  # computed from the fields, kept in the JSON form

    loops: int
    spanning: int

    @property
    def spanning_share(self) -> float | None:
        """Share of the loops whose unit holds a breaker."""
        return self.spanning / self.loops if self.loops else None


def own_loops(texts: Sequence[str], measures: Sequence[LoopMeasures], breakers: str) -> OwnLoops:
    """Count periodic tails and those whose unit holds a breaker."""
    classes = [unit_class(t, m, breakers) for t, m in zip(texts, measures, strict=True)]
    return OwnLoops(sum(c != NO_LOOP for c in classes), sum(c == SPANS for c in classes))


# ---- the comparison -------------------------------------------------------------------------
@dataclass
class CompareConfig:
    """Budget, batch, seed, detector settings, methods and the best-method limits of one comparison."""

    max_new_tokens: int = 57
    batch_size: int = 128
    seed: int = 0
    loop: LoopSettings = field(default_factory=LoopSettings)
    methods: tuple[str, ...] | None = None  # None: every method (edit rows when a patch is given)
    genre: str = "auto"
    engine: str | None = None  # a sampler preset: every method as that engine runs it (build_methods)
    timing_rounds: int = 3
    samples: int = 3
    min_speed: float = 0.25
    min_kept: float = 0.5

    def __post_init__(self) -> None:
        if self.timing_rounds < 1:
            raise ValueError(f"timing_rounds must be >= 1, got {self.timing_rounds}")


@dataclass
class Cost:
    """Generation cost: the whole scan's wall time, and tokens/s on one batch (median of interleaved rounds)."""

    scan_seconds: float
    tokens: int
    timing_batch: int
    timing_seconds: list[float]
    tokens_per_s: float | None
    speed_vs_greedy: float | None  # tokens/s relative to greedy, same batch, same run


@dataclass
class MethodResult:
    """Everything measured for one method."""

    method: Method = field(metadata=NOT_JSON)  # its fields lead the JSON object
    rates: LoopRates
    legit: LegitRates  # all generations
    legit_clean: LegitRates  # generations that are not degenerate
    nll_own: Fluency  # NLL under the unmodified model
    nll_judge: Fluency | None
    cost: Cost
    breaker_classes: list[ClassRate]
    own_loops: OwnLoops
    samples: list[str]
    texts: list[str] = field(repr=False, metadata=NOT_JSON)  # written separately
    degenerate: list[bool] = field(repr=False, metadata=NOT_JSON)

    def to_dict(self) -> dict:
        """The method's fields, then what was measured (:func:`json_safe` of the rest)."""
        return json_safe(self.method) | {
            f.name: json_safe(getattr(self, f.name)) for f in fields(self) if f.metadata.get("json", True)
        }


@dataclass
class MethodVerdict:
    """One decode-time method judged against the best-method rule."""

    name: str
    degenerate_rate: float
    speed_vs_greedy: float | None
    nll_per_char: float | None
    kept: float | None
    acceptable: bool
    reasons: list[str]


@dataclass
class BestChoice:
    """The chosen decode-time method, the rule, its limits and every candidate's verdict."""

    name: str | None
    acceptable: bool
    rule: str
    nll_model: str
    nll_limit: float | None
    skipped: list[str]
    candidates: list[MethodVerdict]


@dataclass
class HumanReference:
    """The human texts' genre-repetition rates and NLL (same caps as the generations)."""

    genre: str
    source: str | None
    reason: str | None
    n: int
    cap_chars: int
    legit: LegitRates | None
    nll_own: Fluency | None
    nll_judge: Fluency | None


@dataclass
class PatchCheck:
    """The patch used by the edit rows and the proof that the model was given back unchanged."""

    path: str | None
    edit: dict | None
    sha256_model: str  # before the comparison
    sha256_patched: str  # the patch's sha256_after
    sha256_after: str  # after the comparison
    reverted: bool


@dataclass
class CompareResult:
    """The whole comparison (JSON via :meth:`to_dict`; the generated texts are written beside it)."""

    model: str | None
    judge: str | None
    backend: str
    prompt_source: str
    prompts: list[str]
    config: CompareConfig
    end_token: EndToken
    ban_ids: list[int]
    breakers: str
    methods: list[MethodResult]
    human: HumanReference
    best: BestChoice | None
    patch: PatchCheck | None
    sample_prompts: list[int]
    baseline_classes: dict[str, int]
    timings_s: dict[str, float]
    notes: list[str]
    calibration: dict | None = None  # the detectors' calibration on human text (LoopCalibration.to_dict())

    def method(self, name: str) -> MethodResult:
        """The result of one method by name."""
        return next(m for m in self.methods if m.method.name == name)

    def to_dict(self) -> dict:
        """Plain JSON, the sample prompts spelled out (all the prompts are in ``compare-texts.json``)."""
        d = {f.name: json_safe(getattr(self, f.name)) for f in fields(self) if f.name != "prompts"}
        return d | {
            "n_prompts": len(self.prompts),
            "best_rule": self.best.rule if self.best else None,
            "sample_prompts": [self.prompts[i] for i in self.sample_prompts],
        }


# ---- stages ---------------------------------------------------------------------------------
def _chars(r: GenerationRecord) -> LoopMeasures:
    """The record's character-level loop measures (LoopStudy.scan measures every decoded text)."""
    assert r.char_measures is not None, "compare scans decode every text"
    return r.char_measures


def _legit(prompts: Sequence[str], texts: Sequence[str], keep: Sequence[bool] | None = None) -> LegitRates:
    counts = [
        legit_counts(p + t, t) for i, (p, t) in enumerate(zip(prompts, texts, strict=True)) if keep is None or keep[i]
    ]
    return legit_rates(counts)


@dataclass
class _Bench:
    """What every method of one comparison runs on (``classes``: each prompt's class by its greedy loop)."""

    study: LoopStudy
    judge: Any
    prompts: Sequence[str]
    ids: list[list[int]]
    patch: Patch | None
    cfg: CompareConfig
    breakers: str
    log: Callable[[str], None]
    classes: list[str] = field(default_factory=list)

    def edits(self, m: Method) -> AbstractContextManager[None]:
        """``patched`` when the method edits the weights (check_methods: edit rows have a patch), else a no-op."""
        return patched(self.study.module, self.patch) if m.patched and self.patch is not None else nullcontext()

    def scan(self, m: Method) -> tuple[ScanResult, float]:
        """Every prompt under ``m``, and the seconds it took."""
        t0 = time.perf_counter()
        with self.edits(m):
            scan = self.study.scan(self.ids, list(self.prompts), sampler=m.sampler, desc=m.name)
        seconds = time.perf_counter() - t0
        s = scan.summary
        self.log(f"  {m.name:<12} degenerate {s.degenerate_rate:6.1%}  exact {s.loop_rate:6.1%}  ({seconds:.1f} s)")
        return scan, seconds

    def fluencies(self, prompts: Sequence[str], texts: Sequence[str]) -> tuple[Fluency, Fluency | None]:
        """NLL per character of ``texts`` after ``prompts`` under the model itself and the judge (None without)."""
        model, judge, batch = self.study.model, self.judge, self.cfg.batch_size
        own = fluency(str(model.source), score_continuations(model, prompts, texts, batch))
        jud = fluency(str(judge.source), score_continuations(judge, prompts, texts, batch)) if judge else None
        return own, jud

    def score(self, m: Method, scan: ScanResult, seconds: float) -> MethodResult:
        """Loop rates, legit repetition, fluency (unmodified model + judge), breaker classes; cost filled later."""
        recs, prompts = scan.records, self.prompts
        texts = [r.text or "" for r in recs]
        degenerate = [r.measures.degenerate for r in recs]
        cost = Cost(round(seconds, 2), sum(len(r.tokens) for r in recs), 0, [], None, None)
        return MethodResult(
            m,
            scan.summary,
            _legit(prompts, texts),
            _legit(prompts, texts, [not d for d in degenerate]),
            *self.fluencies(prompts, texts),
            cost,
            class_rates(self.classes, degenerate),
            own_loops(texts, [_chars(r) for r in recs], self.breakers),
            [],
            texts,
            degenerate,
        )

    def time(self, methods: Sequence[Method], rows: Sequence[MethodResult]) -> None:
        """Fill the cost of ``rows`` with tokens/s on one batch: each of ``methods`` (greedy first) generates it,
        rounds interleaved across methods (shared-machine noise), medians compared with greedy's."""
        study, cfg = self.study, self.cfg
        batch = self.ids[: cfg.batch_size]
        times: dict[str, list[float]] = {m.name: [] for m in methods}
        for _ in range(cfg.timing_rounds):
            for m in methods:
                sampler = study_sampler(m.sampler, study.eos_id)
                with self.edits(m):
                    t0 = time.perf_counter()
                    generate(study.model, batch, cfg.max_new_tokens, sampler, seed=cfg.seed)
                    times[m.name].append(time.perf_counter() - t0)
        tps = {k: len(batch) * cfg.max_new_tokens / statistics.median(v) for k, v in times.items()}
        for r in rows:
            c = r.cost
            c.timing_batch, c.timing_seconds = len(batch), [round(t, 4) for t in times[r.method.name]]
            c.tokens_per_s = tps[r.method.name]
            c.speed_vs_greedy = tps[r.method.name] / tps[BASELINE] if tps.get(BASELINE) else None

    def run(
        self, methods: Sequence[Method], human: HumanTexts, edit_best: bool, clock: Clock
    ) -> tuple[list[MethodResult], HumanReference, BestChoice | None]:
        """Generate, score and time every method, then choose the best decode-time one (and run the edit with it)."""
        scans = {m.name: self.scan(m) for m in methods}
        clock.tick("generate")
        # each prompt's class by its greedy loop; its median length caps the human texts (cut to prompt + cap chars)
        greedy = scans[BASELINE][0].records
        self.classes = [unit_class(r.text or "", _chars(r), self.breakers) for r in greedy]
        cap = int(statistics.median(len(r.text or "") for r in greedy))
        pairs = [(p, h[len(p) : len(p) + cap]) for p, h in zip(self.prompts, human.poems, strict=True) if h is not None]
        ps, conts = [p for p, _ in pairs], [c for _, c in pairs]
        ref = HumanReference(human.genre, None, human.reason, 0, cap, None, None, None)
        if pairs:  # their legit rates and NLL
            ref = HumanReference(
                human.genre, human.source, None, len(pairs), cap, _legit(ps, conts), *self.fluencies(ps, conts)
            )
        results = [self.score(m, *scans[m.name]) for m in methods]
        clock.tick("score")
        self.time(methods, results)
        clock.tick("timing")
        best = choose_best(results, ref, self.cfg) if any(_is_sampler(r.method) for r in results) else None
        if edit_best and best is not None:  # the edit with the best decode-time method, timed in its own rounds
            chosen = next(r.method for r in results if r.method.name == best.name)
            m = Method(EDIT_BEST, f"weight edit + {chosen.name}", chosen.sampler, patched=True)
            results.append(self.score(m, *self.scan(m)))
            self.time([results[0].method, m], results[-1:])
            clock.tick("edit+best")
        return results, ref, best


def _kept(r: MethodResult, human: HumanReference) -> float | None:
    """The method's legitimate repetition relative to human (see :data:`BEST_RULE`), None when not measurable."""
    h = human.legit
    if h is None:
        return None
    keys = ("reduplication_per100", "parallel_per100") if human.genre == "tang" else ("repeated_ngram_rate",)
    ratios = [getattr(r.legit, k) / getattr(h, k) for k in keys if getattr(h, k) and getattr(r.legit, k) is not None]
    return min(ratios) if ratios else None


def choose_best(results: Sequence[MethodResult], human: HumanReference, cfg: CompareConfig) -> BestChoice:
    """Apply :data:`BEST_RULE` to the decode-time methods of ``results``."""
    ref = human.nll_judge if human.nll_judge is not None else human.nll_own
    limit = ref.nll_per_char if ref is not None else None
    skipped = [] if limit is not None else ["NLL limit: no human texts to set it"]
    cands = []
    for r in (r for r in results if _is_sampler(r.method)):
        flu = r.nll_judge if human.nll_judge is not None else r.nll_own
        assert flu is not None  # a judged human reference means a judge scored every method too
        nll, speed, kept = flu.nll_per_char, r.cost.speed_vs_greedy, _kept(r, human)
        reasons = []
        if speed is not None and speed < cfg.min_speed:
            reasons.append(f"speed {speed:.2f}x greedy < {cfg.min_speed:g}x")
        if limit is not None and nll is not None and nll > limit:
            reasons.append(f"NLL {nll:.3f} > human {limit:.3f} nats/char")
        if kept is not None and kept < cfg.min_kept:
            reasons.append(f"keeps {kept:.0%} < {cfg.min_kept:.0%} of the legitimate repetition")
        cands.append(MethodVerdict(r.method.name, r.rates.degenerate_rate, speed, nll, kept, not reasons, reasons))
    if human.legit is None:
        skipped.append("legitimate repetition: " + (human.reason or "no human rates"))
    ok = [c for c in cands if c.acceptable] or cands
    best = min(ok, key=lambda c: (c.degenerate_rate, c.nll_per_char if c.nll_per_char is not None else 0.0))
    rule = BEST_RULE.format(min_speed=cfg.min_speed, min_kept=cfg.min_kept)
    nll_model = "judge" if human.nll_judge is not None else "own model"
    return BestChoice(best.name, best.acceptable, rule, nll_model, limit, skipped, cands)


def compare_fixes(
    model: Any,
    prompts: Sequence[str],
    cfg: CompareConfig | None = None,
    *,
    patch: Patch | None = None,
    patch_path: str | None = None,
    judge: Any = None,
    continuations: Sequence[str | None] | None = None,
    prompt_source: str = "prompts",
    backend: str = "genprobe",
    progress: bool = False,
    log: Callable[[str], None] = lambda s: None,
) -> CompareResult:
    """Run every method on ``prompts`` with a loaded Model (and an optional judge Model); see the module doc."""
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is not available for loop comparisons yet; choose one of {BACKENDS}")
    cfg = cfg or CompareConfig()
    names = check_methods(cfg.methods, patch is not None)
    clock = Clock()
    # the loop study every method generates through (the comparison's length, batch, seed and detectors)
    rcfg = RepairConfig(max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size, seed=cfg.seed, loop=cfg.loop)
    study = LoopStudy(model, rcfg, progress=progress)
    ids = study.encode(prompts)
    human = human_texts(prompts, continuations, cfg.genre)
    breakers = "".join(POEM_BREAKERS if human.genre == "tang" else TEXT_BREAKERS)
    bans = [i for i in (model.unk_id, model.eos_id) if i is not None]  # <unk> (the chanting setting), the end token
    methods = build_methods(names, model.tokenizer, bans, human.genre, cfg.engine)
    sha0 = model.state_sha256()
    log(f"generating {len(prompts)} prompts x {cfg.max_new_tokens} tokens, {len(names)} methods ({human.genre} genre)")
    bench = _Bench(study, judge, prompts, ids, patch, cfg, breakers, log)
    results, ref, best = bench.run(methods, human, EDIT_BEST in names, clock)
    picks = _pick_samples(results, cfg.samples)
    check, sha1 = None, model.state_sha256() if patch is not None else ""
    if patch is not None:
        check = PatchCheck(
            patch_path, patch.meta.get("edit"), sha0, patch.meta.get("sha256_after", ""), sha1, sha1 == sha0
        )
    notes = [n for n in (study.end_token.note, human.reason) if n] + _judge_notes(judge, ref)
    return CompareResult(
        str(model.source) if model.source else None,
        str(judge.source) if judge is not None else None,
        backend,
        prompt_source,
        list(prompts),
        cfg,
        study.end_token,
        bans,
        breakers,
        results,
        ref,
        best,
        check,
        picks,
        {c: bench.classes.count(c) for c in dict.fromkeys(bench.classes)},
        clock.to_dict(),
        notes,
    )


def _pick_samples(results: Sequence[MethodResult], k: int) -> list[int]:
    """The sample prompts (filling each result's ``samples``): the first loop-prone ones and one clean one if any."""
    deg = results[0].degenerate
    bad, good = [i for i, d in enumerate(deg) if d], [i for i, d in enumerate(deg) if not d]
    pick = bad[: max(k - 1, 0)] + good[:1] if good else bad[:k]
    picks = sorted((pick + [i for i in range(len(deg)) if i not in pick])[:k])
    for r in results:
        r.samples = [r.texts[i] for i in picks]
    return picks


def _judge_notes(judge: Any, ref: HumanReference) -> list[str]:
    """Why the fluency numbers may mislead: no judge (a method can game its own NLL), or a judge mapping to <unk>."""
    if judge is None:
        return ["no judge model: fluency is measured under the model itself only, which a method can game"]
    if ref.nll_judge is not None and ref.nll_judge.unk_share > 0:
        return [
            f"the judge's tokenizer maps {ref.nll_judge.unk_share:.1%} of the human texts' tokens to <unk>; "
            "its NLL counts them as one class"
        ]
    return []


def _is_sampler(m: Method) -> bool:
    """A decode-time method (not the greedy baseline, not an edit row)."""
    return m.name != BASELINE and not m.patched
