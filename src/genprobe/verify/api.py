"""``genprobe.verify_cache``: the verifier on a loaded :class:`~genprobe.model.load.Model`, one call, one report;
``genprobe.verify_caches``: everything ``genprobe verify-cache`` runs, one call, one :class:`CacheVerification`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Sequence, TypedDict, Unpack, cast

from .._io import json_safe
from ..model.llama_family import llama_family_of, unsupported_reason
from .adapters import (
    CacheUnavailableError,
    CompiledEngineAdapter,
    EngineAdapter,
    FullRecompute,
    HFAdapter,
    ImplFactoryError,
    load_impl,
)
from .compare import Thresholds, at_least
from .harness import DEFAULTS, ReferenceRun, VerifyOptions, verify_implementation
from .hf_caches import CACHE_KINDS, unavailable_reason
from .mutants import DEFAULT_PROMPT, MUTANTS, mask_noop, report_row, run_mutant_reports, teaching_view
from .report import PhaseError, VerifyReport
from .reuse import REUSE_LENGTH, random_ids

if TYPE_CHECKING:  # pragma: no cover
    from ..model.gpt import GPT
    from ..model.load import Model

DEFAULT_PROMPTS = (DEFAULT_PROMPT, "白日依山盡")  # the chapter's prompt (§3.9.1) and a second of another length


class CacheOptions(TypedDict, total=False):
    """The options :func:`verify_cache` and :func:`verify_caches` take as keywords: the fields of
    :class:`~genprobe.verify.harness.VerifyOptions` that a caller sets (their defaults and meaning are there)."""

    compiled: bool
    max_new_tokens: int
    chunk_sizes: Sequence[int]
    window: int | None
    sinks: int
    hf_position_ids: bool
    padded_batch: bool
    isolation: bool
    prefix_reuse: bool
    noise_floor: bool
    thresholds: Thresholds


def verify_cache(
    model: "Model",
    impl: Any = None,
    *,
    hf_cache: str | None = None,
    prompts: Sequence[str] | Sequence[Sequence[int]] | None = None,
    log: Callable[[str], None] = lambda msg: None,
    **options: Unpack[CacheOptions],
) -> VerifyReport:
    """Verify ``impl`` (default: the model's own cache) against full recomputation of ``model``: one report.

    ``impl`` is any object with ``reset()``, ``prefill(ids, attention_mask=None)`` and ``step(ids)``.
    ``hf_cache`` picks a ``transformers`` cache class (see ``genprobe.verify.hf_caches``; one unavailable here raises
    :class:`~genprobe.verify.adapters.CacheUnavailableError`). ``prompts`` and ``options`` (the fields of
    :class:`~genprobe.verify.harness.VerifyOptions` but ``pad_id``, the model's) as in :func:`verify_caches`.
    """
    hf_caches = () if hf_cache is None else (hf_cache,)
    (report,) = verify_caches(model, impl, hf_caches=hf_caches, prompts=prompts, log=log, **options).reports
    if report.unavailable is not None:
        raise CacheUnavailableError(f"cache {hf_cache!r} is unavailable: {report.unavailable}")
    return report


# ---- several implementations at once: what `genprobe verify-cache` runs ---------------------------------
HF_CACHE_ALL = "all"  # hf_caches=("all",): every kind of genprobe.verify.hf_caches.CACHE_KINDS


@dataclass
class VerifyTarget:
    """One implementation to verify, or the report of one that could not be built (``impl`` is then None)."""

    impl: Any
    name: str | None = None  # display name; None: the implementation's own ``name`` (or its class name)
    report: VerifyReport | None = None  # not built: unavailable here, or its factory raised


class VerifyTargets(NamedTuple):
    """The reference (full recomputation, or a model-less implementation's own ``full``) and the targets."""

    reference: Any
    targets: list[VerifyTarget]


def _refuse_mismatches(model: "Model | None", impl: Any, opts: VerifyOptions, hf_caches: Sequence[str]) -> None:
    """Refuse, before anything is built, options that do not apply to the model and implementation given."""
    kind = None if model is None else model.kind
    if model is None and impl is None:
        raise ValueError("give a model (the reference, and its own cache) and/or an implementation")
    if opts.compiled:
        why = "an impl was given" if impl is not None else "no model" if model is None else None
        if why is None and model is not None and model.kind != "genprobe":
            why = unsupported_reason(model.module)
        if why:
            raise ValueError(
                "compiled verifies genprobe's own compiled decode path: give a genprobe model or a Llama-family "
                f"transformers model, no impl ({why})"
            )
    if hf_caches and (kind != "hf" or impl is not None):
        raise ValueError("hf_caches verifies a transformers model's own cache classes: give one, no impl")
    if opts.window is not None and kind != "genprobe":
        raise ValueError(
            "a window applies to a genprobe model's reference; a transformers model's window comes from its config "
            "(sliding_window)"
        )


def verify_targets(
    model: "Model | None", impl: Any = None, opts: VerifyOptions = DEFAULTS, hf_caches: Sequence[str] = ()
) -> VerifyTargets:
    """What to verify against what: the reference of ``model`` and the implementations under test.

    ``impl`` is an implementation object or a ``"module:factory"`` spec (built by ``factory(model.module)`` or
    ``factory()``; a factory that raises gives a target whose report has verdict ``error``, phase ``factory``).
    Without ``impl``: the model's own cache — our engine (windowed with ``opts.window``/``sinks``) plus, with
    ``opts.compiled``, the torch.compile'd decode path (:class:`~genprobe.verify.adapters.CompiledEngineAdapter`) for
    a genprobe model; for a transformers model its default cache, or each class named in ``hf_caches`` (``"all"``:
    every kind), a kind unavailable here being a target whose report has verdict ``unavailable`` and the reason.
    ``opts.hf_position_ids=False`` drives a transformers model without ``position_ids``. Without ``model``, ``impl``
    must have ``full(ids, attention_mask=None)``, which is then the reference.
    """
    _refuse_mismatches(model, impl, opts, hf_caches)
    reference = None if model is None else FullRecompute(model.module, opts.window, opts.sinks)
    if impl is not None:  # the one target of a user implementation
        name = impl if isinstance(impl, str) else None
        if isinstance(impl, str):
            try:
                impl = load_impl(impl, None if model is None else model.module)
            except ImplFactoryError as exc:  # a factory that raises is a report (phase "factory"), not a crash
                err = PhaseError.from_exception("factory", exc.exc)
                report = VerifyReport(impl, "error", opts.thresholds, opts.max_new_tokens, errors=[err])
                return VerifyTargets(reference, [VerifyTarget(None, name, report)])
        if reference is None and not callable(getattr(impl, "full", None)):
            raise ValueError(
                f"{name or type(impl).__name__} was built without a model: give MODEL as the reference, or "
                "give the adapter a full(ids, attention_mask=None) method that recomputes without a cache"
            )
        return VerifyTargets(reference or impl, [VerifyTarget(impl, name)])
    assert model is not None
    ours = model.kind == "genprobe"  # Model gives that kind for a GPT only
    targets = []
    if ours:
        targets.append(VerifyTarget(EngineAdapter(cast("GPT", model.module), window=opts.window, sinks=opts.sinks)))
    asked: list[str | None] = [] if ours else list(hf_caches) or [None]  # None: the model's own default cache
    for k in list(CACHE_KINDS) if HF_CACHE_ALL in asked else list(dict.fromkeys(asked)):
        why = None if k is None else unavailable_reason(model.module, k)
        if why is None:
            targets.append(VerifyTarget(HFAdapter(model.module, pass_position_ids=opts.hf_position_ids, cache=k)))
            continue
        name = f"hf:{model.arch}[{k}]"
        report = VerifyReport(name, "unavailable", opts.thresholds, opts.max_new_tokens, unavailable=why)
        targets.append(VerifyTarget(None, name, report))
    if opts.compiled:
        lm = cast("GPT", model.module) if ours else llama_family_of(model.module)
        targets.append(VerifyTarget(CompiledEngineAdapter(lm)))
    return VerifyTargets(reference, targets)


def mutant_model(model: "Model | None", window: int | None = None) -> Any:
    """The model to plant the mutants into: a genprobe GPT, a GPT-2 converted to ours, or a transformers Llama-family
    model; a ValueError for any other (:func:`~genprobe.verify.mutants.teaching_view` names them), or with a window
    (the mutants' caches have none)."""
    if window is not None:
        raise ValueError("a window cannot be combined with the mutants (their caches have no window)")
    if model is None:
        raise ValueError("mutants need a model to plant bugs into")
    if model.kind != "genprobe" and model.arch == "gpt2":
        from ..model.hf import from_hf_gpt2

        return from_hf_gpt2(cast(Any, model.module))
    teaching_view(model.module)  # refuses any other model before anything runs
    return model.module


@dataclass
class MutantTable:
    """The planted-bug mutants' reports, their rows (expected verdict, caught or not) and no_mask's no-op."""

    reports: list[VerifyReport]
    rows: list[dict[str, Any]]
    mask_noop: dict[str, Any]

    @property
    def failing(self) -> list[str]:
        """The mutants not as expected: a bug not caught, or a correct variant (``cat_order``) flagged."""
        return [
            f"mutant {r['impl']} ({'not caught' if r['expected'] != 'pass' else 'flagged'})"
            for r in self.rows
            if not r["as_expected"]
        ]


def mutant_table(
    model: Any, prompts: Sequence[Sequence[int]], opts: VerifyOptions = DEFAULTS, run: Any = None
) -> MutantTable:
    """The planted-bug mutants on the chapter's §3.9.1 experiment: the first prompt, every phase but padding and
    isolation; plus no_mask's one-token no-op (§3.9.4). ``model`` is a GPT or a Llama-family transformers model
    (:func:`mutant_model`); ``run``, a :class:`~genprobe.verify.harness.ReferenceRun` of that same model, reuses its
    trajectories."""
    first = [list(prompts[0])]
    reports = run_mutant_reports(model, first, opts, run=run)
    rows = [report_row(r, MUTANTS[r.impl], detailed=True) for r in reports]
    biggest = max(opts.chunk_sizes)
    noop = mask_noop(model, first[0], opts.max_new_tokens, chunk=biggest if biggest > 1 else 4, run=run)
    return MutantTable(reports, rows, noop)


@dataclass
class CacheVerification:
    """Every report of one verification: the implementations', the mutants' (when run), prompts and reference."""

    reports: list[VerifyReport]
    prompts: list[list[int]]
    reference: str | None  # the reference's name; None when nothing ran
    thresholds: Thresholds
    mutants: MutantTable | None = None

    @property
    def all_reports(self) -> list[VerifyReport]:
        return self.reports + (self.mutants.reports if self.mutants is not None else [])

    @property
    def noise_floor(self) -> dict[str, Any] | None:
        """The reference's noise floor (value and sources), shared by every report."""
        return next((r.noise_floor for r in self.all_reports if r.noise_floor is not None), None)

    @property
    def pass_line(self) -> float | None:
        """The |Δlogit| below which a phase passes: max(noise, floor_multiple x floor), shared by every report."""
        return next((r.pass_line for r in self.all_reports if r.pass_line is not None), None)

    @property
    def errors(self) -> list[str]:
        return [r.impl for r in self.reports if r.verdict == "error"]

    def failing(self, fail_on: str = "bug") -> list[str]:
        """Implementations whose verdict is ``fail_on`` or worse, then mutants not as expected."""
        bad = [r.impl for r in self.reports if at_least(r.verdict, fail_on)]
        return bad + (self.mutants.failing if self.mutants is not None else [])

    def to_dict(self, fail_on: str = "bug") -> dict[str, Any]:
        """Plain JSON: ``genprobe verify-cache --json`` less ``weight_dtype``, ``narrow_output`` and ``exit_status``."""
        return {
            "implementations": [json_safe(r) for r in self.reports],
            "mutants": self.mutants.rows if self.mutants is not None else [],
            "mask_noop": self.mutants.mask_noop if self.mutants is not None else None,
            "prompts": self.prompts,
            "reference": self.reference,
            "noise_floor": self.noise_floor,
            "pass_line": self.pass_line,
            "thresholds": json_safe(self.thresholds),
            "failing": self.failing(fail_on),
            "errors": self.errors,
        }


def encode_prompts(model: "Model | None", prompts: Sequence[str] | Sequence[Sequence[int]]) -> list[list[int]]:
    """Texts (encoded with the model's tokenizer) or token-id lists, as token ids; none may be empty."""
    if not prompts:
        raise ValueError("prompts is empty: give at least one prompt")
    if any(isinstance(p, str) for p in prompts) and (model is None or model.tokenizer is None):
        raise ValueError("text prompts need a model with a tokenizer: pass token ids")
    ids = [model.encode(p) if isinstance(p, str) else [int(t) for t in p] for p in prompts]  # type: ignore[union-attr]
    if any(not p for p in ids):
        raise ValueError("a prompt encodes to no tokens")
    return ids


def verify_caches(
    model: "Model | None",
    impl: Any = None,
    *,
    hf_caches: Sequence[str] = (),
    mutants: bool = False,
    prompts: Sequence[str] | Sequence[Sequence[int]] | None = None,
    log: Callable[[str], None] = lambda msg: None,
    **options: Unpack[CacheOptions],
) -> CacheVerification:
    """Verify every target of :func:`verify_targets` against one shared reference run (what ``genprobe
    verify-cache`` does), and with ``mutants`` the planted-bug mutants on the model (:func:`mutant_table`).

    ``impl``: an implementation object or a ``"module:factory"`` spec; ``hf_caches`` as in :func:`verify_targets`.
    ``prompts``: texts or token-id lists (default: two Tang openings for a character-level genprobe model, else up to
    three seeded random-id prompts of distinct lengths ≤ 8 that leave room for the new tokens; without a model, in the
    implementation's ``vocab_size``). ``log`` gets one progress line per implementation; ``options`` are
    :class:`~genprobe.verify.harness.VerifyOptions`' fields but ``pad_id`` (the model's). ``result.failing(fail_on)``
    and ``result.errors`` are what ``verify-cache`` turns into its exit status.
    """
    opts = VerifyOptions(**options, pad_id=model.pad_id if model is not None else 0)
    gpt = mutant_model(model, opts.window) if mutants else None
    targets = verify_targets(model, impl, opts, hf_caches)
    steps, built = opts.max_new_tokens, [t.impl for t in targets.targets if t.report is None]
    if prompts is not None:
        ids = encode_prompts(model, prompts)
    elif model is not None and model.kind == "genprobe" and model.tokenizer is not None:
        ids = [model.encode(t) for t in DEFAULT_PROMPTS]
    elif model is None and not built:  # a model-less factory that raised leaves nothing to take prompts from
        ids = []
    else:  # random ids: up to three distinct lengths <= 8 that leave room for the new tokens
        vocab = model.vocab_size if model is not None else getattr(built[0], "vocab_size", None)
        limit = model.max_positions if model is not None else getattr(targets.reference, "max_positions", None)
        if vocab is None:
            raise ValueError("cannot tell the vocabulary size for random prompts: pass prompts, or a model")
        room = 8 if limit is None else max(1, min(8, limit - steps))
        ids = random_ids(int(vocab), sorted({room, max(1, room * 5 // 8), max(1, room * 3 // 8)}, reverse=True))
    run = ReferenceRun(targets.reference, steps) if built else None
    reports = []
    for t in targets.targets:
        if t.report is not None:  # could not be built: the report says why
            reports.append(t.report)
            continue
        assert run is not None  # there is a reference run whenever a target was built
        if getattr(t.impl, "cache_kind", None) == "static":  # it attends over all its slots: size it to the run
            t.impl.max_cache_len = max(max(len(p) for p in ids) + steps, REUSE_LENGTH) + 1  # or a reuse sequence
        label = t.name or getattr(t.impl, "name", type(t.impl).__name__)
        log(f"verifying {label} on {len(ids)} prompt(s), {steps} steps …")
        reports.append(verify_implementation(t.impl, run, ids, opts, name=t.name))
    table = None
    if gpt is not None:  # on the reference's own model, the reference run's trajectories serve
        log(f"running {len(MUTANTS)} mutants …")
        same = getattr(targets.reference, "model", None) is gpt
        table = mutant_table(gpt, ids, opts, run=run if same else None)
    return CacheVerification(reports, ids, run.name if run is not None else None, opts.thresholds, table)
