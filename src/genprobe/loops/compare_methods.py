"""The fixes ``loops compare`` puts side by side (:data:`METHODS`): decode-time samplers, each differing from its
base (greedy, or ``sample`` for XTC) by one knob, the weight edit, and the edit + best sampler; every method bans the
same ids. Loops are classified by sequence breaker (:data:`CLASSES`) to see what DRY misses (docs/which-fix.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ..engine.samplers.llama_cpp import DEFAULT_BREAKERS, tokenizer_breakers
from ..engine.samplers.stages import SamplerConfig
from ..metrics.degeneracy import LoopMeasures
from ..metrics.stats import wilson_interval

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
    EDIT_BEST: ("weight edit + best sampler", {}),  # the best method's sampler (edit_with)
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
    """The :class:`Method` of every name except ``edit+best`` (built by :func:`edit_with`); ``engine`` (a
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


def edit_with(best: Method) -> Method:
    """The weight edit combined with ``best``'s sampler."""
    return Method(EDIT_BEST, f"weight edit + {best.name}", best.sampler, patched=True)


# ---- loops classified by sequence breaker ----------------------------------------------------
SPANS, WITHIN, NO_LOOP = "spans a breaker", "within a line", "no baseline loop"
CLASSES = (SPANS, WITHIN, NO_LOOP)


def unit_class(text: str, measures: LoopMeasures, breakers: str) -> str:
    """:data:`SPANS`, :data:`WITHIN` or :data:`NO_LOOP` for one generation measured on its characters, by one period
    of its periodic tail (exact period first, else the near period)."""
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
