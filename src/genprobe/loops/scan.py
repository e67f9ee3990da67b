"""Loop scan: generate after every prompt (batched, end token banned), measure loops on tokens and decoded
characters, aggregate rates and histograms. :func:`scan_batches` is the scan written once for every engine;
:func:`scan_loop_settings` (``genprobe loops scan``) runs it under several decoding settings through genprobe's engine
or a :class:`ScanEngine` (docs/loop-repair.md, docs/calibration.md).
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from dataclasses import astuple, dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

from tqdm import tqdm

from .._io import json_safe
from ..corpus.inputs import default_prompts
from ..engine import loaded
from ..engine.backend import Backend, Request, check_api_sampler
from ..engine.generate import generate
from ..engine.runner import check_prompt_ids
from ..engine.samplers.stages import SamplerConfig
from ..metrics.calibrate import DEFAULT_TARGET, LoopCalibration, calibrate_loop_settings
from ..metrics.degeneracy import LoopMeasures, LoopSettings, measure_loops
from ..metrics.ngrams import unk_share
from ..metrics.stats import wilson_interval

CHARS_NOT_UNIT_NOTE = (
    "characters are not this tokenizer's unit: the character-level figures (under 'chars') use detector "
    "thresholds that were not calibrated on characters and are not a verdict"
)
SHORT_PERIOD_MAX = 4  # "chanting": units of 1–4 tokens; longer periods are couplet-like cycles
ONSET_BIN = 8
END_TOKEN_NOTE = (
    "the end-of-text token (id {eos}) is banned: every generation has exactly {n} new tokens, so a loop cannot "
    "hide behind an early stop; the rates describe the model forced to continue"
)


def chanting_sampler(unk_id: int | None = 1, eos_id: int | None = None) -> SamplerConfig:
    """The chapter's "chanting" setting: greedy with ``<unk>`` banned (and the end token, when there is one)."""
    return SamplerConfig(greedy=True, ban_ids=tuple(i for i in (unk_id, eos_id) if i is not None))


def greedy_sampler(eos_id: int | None = None) -> SamplerConfig:
    """Plain greedy (argmax); the end token banned when there is one (fixed-length loop studies)."""
    return chanting_sampler(None, eos_id)


def study_sampler(sampler: SamplerConfig, eos_id: int | None) -> SamplerConfig:
    """``sampler`` with the end token added to its banned ids (unchanged when there is no end token)."""
    if eos_id is None or eos_id in sampler.ban_ids:
        return sampler
    return replace(sampler, ban_ids=tuple(sampler.ban_ids) + (int(eos_id),))


@dataclass
class GenerationRecord:
    """One prompt's generation and its loop measures (tokens; characters when decoded)."""

    prompt_ids: list[int]
    tokens: list[int]
    hit_limit: bool
    unk_share: float
    measures: LoopMeasures
    char_measures: LoopMeasures | None = None
    prompt: str | None = None
    text: str | None = None
    unit_text: str = ""

    def to_dict(self) -> dict:
        """Token measures at the top level (as before), character measures under ``chars``."""
        keys = ("prompt", "text", "prompt_ids", "tokens", "hit_limit", "unk_share", "unit_text")
        return {k: getattr(self, k) for k in keys} | json_safe(self.measures) | {"chars": json_safe(self.char_measures)}


@dataclass
class LoopRates:
    """Aggregate loop measures of a set of sequences (one alphabet: tokens or characters)."""

    n: int
    loops: int
    loop_rate: float
    loop_rate_ci95: list[float]
    near_loops: int
    near_loop_rate: float
    near_loop_rate_ci95: list[float]
    any_loops: int
    any_loop_rate: float
    any_loop_rate_ci95: list[float]
    repetitive: int
    repetitive_rate: float
    repetitive_rate_ci95: list[float]
    degenerate: int
    degenerate_rate: float  # exact loop, near loop or repetitive tail: what a repair must lower
    degenerate_rate_ci95: list[float]
    short_period_max: int
    short_loop_rate: float  # exact loops with period <= short_period_max
    long_loop_rate: float
    short_any_rate: float  # exact-or-near loops by their period (exact period first)
    long_any_rate: float
    mean_distinct_2: float
    mean_seq_rep_4: float
    mean_longest_repeat: float
    mean_tail_compression: float
    mean_near_match: float
    period_hist: dict[str, int]
    near_period_hist: dict[str, int]
    onset_hist: dict[str, int]
    length_capped_rate: float | None = None
    chars: "LoopRates | None" = None
    human_fpr: dict[str, dict] | None = None  # held-out human false-positive rate per detector (calibrated scans)
    chars_unit: bool | None = None  # False: the character view is not a verdict (subword tokenizer)
    chars_note: str | None = None


def progress_bar(items: Any, desc: str, unit: str, progress: bool, leave: bool = True) -> Any:
    """``items`` with a tqdm bar on stderr when ``progress`` and stderr is a terminal."""
    off = not progress or not sys.stderr.isatty()
    return tqdm(items, desc=desc, unit=unit, file=sys.stderr, disable=off, leave=leave)


def loop_rates(measures: Sequence[LoopMeasures]) -> LoopRates:
    """Exact, near, any-loop, repetitive and degenerate rates (+ Wilson 95% CIs), short/long, histograms, means."""
    n = len(measures)
    exact = [m for m in measures if m.looping]
    near = [m for m in measures if m.near_looping]
    anyl = [m for m in measures if m.any_loop]
    # A loop always has a period and an onset; the filters only tell the type checker so.
    short = sum(1 for m in exact if m.period is not None and m.period <= SHORT_PERIOD_MAX)
    short_any = sum(1 for m in anyl if m.any_period is not None and m.any_period <= SHORT_PERIOD_MAX)
    onsets = [(m.onset // ONSET_BIN) * ONSET_BIN for m in exact if m.onset is not None]

    def share(k: float) -> float:
        return k / n if n else 0.0

    counts = {
        ("loops", "loop_rate"): len(exact),
        ("near_loops", "near_loop_rate"): len(near),
        ("any_loops", "any_loop_rate"): len(anyl),
        ("repetitive", "repetitive_rate"): sum(m.repetitive for m in measures),
        ("degenerate", "degenerate_rate"): sum(m.degenerate for m in measures),
    }
    rates: dict[str, Any] = {}
    for (count, rate), k in counts.items():
        rates[count], rates[rate], rates[f"{rate}_ci95"] = k, share(k), list(wilson_interval(k, n))
    for name in ("distinct_2", "seq_rep_4", "longest_repeat", "tail_compression", "near_match"):
        rates[f"mean_{name}"] = share(sum(getattr(m, name) for m in measures))
    return LoopRates(
        n=n,
        **rates,
        short_period_max=SHORT_PERIOD_MAX,
        short_loop_rate=share(short),
        long_loop_rate=share(len(exact) - short),
        short_any_rate=share(short_any),
        long_any_rate=share(len(anyl) - short_any),
        period_hist={str(p): c for p, c in sorted(Counter(m.period for m in exact).items())},
        near_period_hist={str(p): c for p, c in sorted(Counter(m.near_period for m in near).items())},
        onset_hist={f"{lo}-{lo + ONSET_BIN - 1}": c for lo, c in sorted(Counter(onsets).items())},
    )


def summarise(records: Sequence[GenerationRecord]) -> LoopRates:
    """Token-level rates of ``records`` with the length-capped share and, when decoded, character-level rates."""
    rates = loop_rates([r.measures for r in records])
    rates.length_capped_rate = sum(1 for r in records if r.hit_limit) / len(records) if records else 0.0
    chars = [r.char_measures for r in records if r.char_measures is not None]
    if records and len(chars) == len(records):
        rates.chars = loop_rates(chars)
    return rates


@dataclass
class ScanSettings:
    """How a scan was run (JSON): sampler, budget, seed, detector settings, end-token handling."""

    sampler: dict
    max_new_tokens: int
    seed: int
    loop: dict
    eos_id: int | None = None
    eos_banned: bool = False
    note: str | None = None
    calibration: dict | None = None  # LoopCalibration.to_dict() of the settings in ``loop``, when calibrated
    chars_unit: bool | None = None


@dataclass
class ScanResult:
    """Per-generation records and the aggregate summary of one scan."""

    records: list[GenerationRecord]
    summary: LoopRates
    settings: ScanSettings
    calibration: LoopCalibration | None = None

    def to_dict(self, with_records: bool = True) -> dict:
        """Plain JSON."""
        d = {"settings": json_safe(self.settings), "summary": json_safe(self.summary)}
        return d | ({"records": json_safe(self.records)} if with_records else {})


def generation_record(
    prompt: list[int],
    toks: list[int],
    hit_limit: bool,
    unk_id: int | None,
    loop: LoopSettings,
    decode: Callable[[list[int]], str] | None,
    prompt_text: str | None,
) -> GenerationRecord:
    """One generation's record (its loop measures, the <unk> share), as every scan backend builds it."""
    m = measure_loops(toks, loop)
    rec = GenerationRecord(prompt, toks, hit_limit, unk_share(toks, unk_id) if unk_id is not None else 0.0, m)
    if decode is not None:
        rec.prompt = prompt_text if prompt_text is not None else decode(prompt)
        rec.text = decode(toks)
        rec.char_measures = measure_loops(rec.text, loop)
        rec.unit_text = decode(list(m.unit)) if m.looping else ""
    return rec


@dataclass(frozen=True)
class ScanOptions:
    """How a scan runs beside its prompts, built once by its caller and passed whole to every engine's scan.
    ``eos_id`` is banned, never used to stop; ``sampler`` defaults to chanting (``unk_id`` banned); ``decode``
    (ids -> str) adds texts and character-level measures; ``loop``: the detector settings (default: raw defaults)."""

    max_new_tokens: int = 57
    sampler: SamplerConfig | None = None
    batch_size: int = 64
    seed: int = 0
    eos_id: int | None = None
    unk_id: int | None = 1
    loop: LoopSettings | None = None
    decode: Callable[[list[int]], str] | None = None
    progress: bool = False
    desc: str = "scan"

    @property
    def end_token(self) -> EndToken:
        """Whether the end token exists and is banned (with the note the CLI prints)."""
        eos = self.eos_id
        note = None if eos is None else END_TOKEN_NOTE.format(eos=eos, n=self.max_new_tokens)
        return EndToken(eos, eos is not None, note)


@dataclass
class Batch:
    """One batch of a scan, as every engine's batch generator receives it (seeded from ``options.seed``)."""

    prompts: list[list[int]]
    texts: list[str] | None  # the prompts as text, when given (a server that takes only text prompts needs them)
    sampler: SamplerConfig  # with the study's bans
    first: int  # index of its first prompt in the scan
    index: int  # the batch's number
    options: ScanOptions


@dataclass(frozen=True)
class EndToken:
    """The model's end-of-text token and whether loop studies ban it (they do whenever there is one)."""

    id: int | None
    banned: bool
    note: str | None


#: One engine's generation of one batch: for each prompt its new token ids and whether it ran the whole budget.
GenerateBatch = Callable[[Batch], list[tuple[list[int], bool]]]


def scan_batches(
    generate_batch: GenerateBatch,
    prompts: Sequence[Sequence[int]],
    options: ScanOptions = ScanOptions(),
    prompt_texts: Sequence[str] | None = None,
) -> ScanResult:
    """The scan, written once for every engine: ``options.batch_size`` prompts at a time through ``generate_batch``,
    each generation measured, the records summarised with the settings that made them (:func:`annotate_scan` adds a
    calibration's human rates)."""
    if not prompts:
        raise ValueError("no prompts to scan")
    o = options
    if o.batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {o.batch_size}")
    loop = o.loop or LoopSettings()
    sampler = study_sampler(o.sampler or chanting_sampler(o.unk_id), o.eos_id)
    texts = list(prompt_texts) if prompt_texts is not None else None
    records: list[GenerationRecord] = []
    starts = range(0, len(prompts), o.batch_size)
    for bi, start in enumerate(progress_bar(starts, o.desc, "batch", o.progress, leave=False)):
        chunk = [list(p) for p in prompts[start : start + o.batch_size]]
        chunk_texts = texts[start : start + o.batch_size] if texts is not None else None
        for j, (toks, full) in enumerate(generate_batch(Batch(chunk, chunk_texts, sampler, start, bi, o))):
            text = chunk_texts[j] if chunk_texts is not None else None
            records.append(generation_record(chunk[j], toks, full, o.unk_id, loop, o.decode, text))
    settings = ScanSettings(json_safe(sampler), o.max_new_tokens, o.seed, json_safe(loop), *astuple(o.end_token))
    return ScanResult(records, summarise(records), settings)


def detector_settings(calibration: LoopCalibration | None, loop: LoopSettings | None) -> LoopSettings | None:
    """The loop detector's settings: the calibration's when one is given (``loop`` may only repeat them)."""
    if calibration is None:
        return loop
    if loop is not None and loop != calibration.settings:
        raise ValueError("give either loop settings or a calibration (which fixes them), not both")
    return calibration.settings


def check_prompts(batch: Batch, vocab_size: int, max_len: int | None = None) -> None:
    """Refuse, before an engine generates the batch, a prompt it cannot run (:func:`check_prompt_ids`)."""
    n_new, limit = batch.options.max_new_tokens, f"the engine's max_model_len {max_len}"
    check_prompt_ids(batch.prompts, n_new, vocab_size, max_len, limit, batch.first)


def engine_batches(model: Any, compile: bool = False) -> GenerateBatch:
    """The scan's batch generator in genprobe's engine: batch ``i`` decoded together with seed ``seed + i``;
    ``compile=True``: through the compiled fast path (the same tokens as the eager loop; docs/llama-fast.md)."""

    def generate_batch(b: Batch) -> list[tuple]:
        o = b.options
        res = generate(model, b.prompts, o.max_new_tokens, b.sampler, seed=o.seed + b.index, compile=compile)
        return [(toks, finished == "length") for toks, finished in zip(res.tokens, res.finished, strict=True)]

    return generate_batch


def backend_batches(backend: Backend, concurrency: int = 1) -> GenerateBatch:
    """The scan's batch generator over any :class:`~genprobe.engine.backend.Backend`: ``concurrency`` requests in
    flight, prompt ``i`` sampled with seed ``seed + i``, texts to a backend that takes only text prompts."""
    caps = backend.capabilities

    def generate_batch(b: Batch) -> list[tuple]:
        prompts: list[tuple[int, ...] | str] = [tuple(p) for p in b.prompts]
        if not caps.token_prompts:
            if b.texts is None:
                raise ValueError(f"the {caps.server} server takes text prompts: give the prompts as text")
            prompts = list(b.texts)
        # logprobs=1: an OpenAI-compatible server names the generated ids only in its log-probabilities
        n_new, first = b.options.max_new_tokens, b.options.seed + b.first
        seeds = range(first, first + len(prompts))
        reqs = [Request(p, n_new, b.sampler, s, logprobs=1) for p, s in zip(prompts, seeds, strict=True)]
        outs = backend.complete_many(reqs, concurrency)
        return [(o.token_ids, len(o.token_ids) == n_new) for o in outs]

    return generate_batch


def annotate_scan(
    result: ScanResult, calibration: LoopCalibration | None, chars_unit: bool | None = None
) -> ScanResult:
    """``result`` with its calibration's human rates beside every rate and whether characters are the unit (refused
    when the scan's length or settings are not the calibration's)."""
    if calibration is not None:
        if calibration.length != result.settings.max_new_tokens:
            raise ValueError(
                f"the calibration is for {calibration.length}-token sequences but the scan generated "
                f"{result.settings.max_new_tokens} tokens: calibrate at the scan's length"
            )
        if result.settings.loop != json_safe(calibration.settings):
            raise ValueError("the scan ran with other detector settings than the calibration's")
        result.calibration = calibration
        result.settings.calibration = json_safe(calibration)
        result.summary.human_fpr = {k: json_safe(v) for k, v in calibration.heldout_fpr.items()}
        chars_unit = calibration.chars_unit if chars_unit is None else chars_unit
    result.settings.chars_unit = chars_unit
    result.summary.chars_unit = chars_unit
    if chars_unit is False and result.summary.chars is not None:
        result.summary.chars_note = CHARS_NOT_UNIT_NOTE
    return result


def calibrate_for_scan(
    tokenizer: Any,
    length: int,
    prompts: Sequence[str],
    *,
    human_text: str | None = None,
    base: LoopSettings | None = None,
    target: float = DEFAULT_TARGET,
    unk_id: int | None = None,
) -> LoopCalibration:
    """Detector settings calibrated on human text of ``tokenizer`` and ``length`` tokens: the file ``human_text``
    (one document per line), else the corpus matching the prompts' script (docs/calibration.md)."""
    from ..corpus.inputs import human_sequences

    seqs, source = human_sequences(tokenizer, length, prompts, human_text=human_text, unk_id=unk_id)
    chars_unit = getattr(tokenizer, "kind", None) == "char"
    return calibrate_loop_settings(seqs, source=source, chars_unit=chars_unit, base=base, target=target)


# ---- several decoding settings of one scan (``genprobe loops scan``) ----------------------------
UNK_SHOW = "▯"


def study_options(model: Any, options: ScanOptions) -> ScanOptions:
    """``options`` with ``model``'s end token (banned), unknown token and decoder; refused without a tokenizer or
    under 16 new tokens (too few to see a loop)."""
    if model.tokenizer is None:
        raise ValueError("loop studies need the model's tokenizer (to encode prompts and decode generations)")
    if options.max_new_tokens < 16:
        raise ValueError(f"max_new_tokens must be >= 16 to see loops, got {options.max_new_tokens}")

    def decode(ids: list[int]) -> str:
        try:
            return str(model.tokenizer.decode(ids, show_unk=True, unk_text=UNK_SHOW))
        except TypeError:  # subword tokenizers: no show_unk option
            return str(model.tokenizer.decode(ids))

    return replace(options, eos_id=model.eos_id, unk_id=model.unk_id, decode=decode)


def encode_prompts(model: Any, texts: Sequence[str]) -> list[list[int]]:
    """Prompts → ids (:func:`genprobe.engine.loaded.encode_prompts`); an empty encoding is refused."""
    ids = loaded.encode_prompts(model, texts)[0]
    empty = [t for t, i in zip(texts, ids, strict=True) if not i]
    if empty:
        raise ValueError(f"prompt {empty[0]!r} encodes to no token")
    return ids


@dataclass(frozen=True)
class ScanEngine:
    """Who generates a scan other than genprobe's engine: ``check(sampler, model, n_ctx)`` refuses (``ValueError``)
    a setting it cannot run exactly; ``start(model, options, ids, log)`` returns the batch generator and its JSON."""

    name: str  # as messages name it: "vLLM", "llama.cpp", "the vllm server"
    check: Callable[[SamplerConfig, Any, int], None]
    start: Callable[[Any, ScanOptions, Sequence[Sequence[int]], Callable[[str], None]], tuple[GenerateBatch, dict]]


SEEDS_NOTE = "reproducibility: the server ignores per-request seeds, so a sampled setting differs run to run"


def backend_engine(backend: Backend, concurrency: int | None = None) -> ScanEngine:
    """Any :class:`~genprobe.engine.backend.Backend` as a scan engine, ``concurrency`` requests in flight (default:
    as many as it serves at once); the JSON names the server and lists what its capabilities left unchecked."""
    caps = backend.capabilities
    not_checked = []
    if not caps.token_prompts:
        not_checked.append(f"prompt ids: the {caps.server} server tokenizes the prompt texts itself")

    def check(sampler: SamplerConfig, model: Any, n_ctx: int) -> None:
        check_api_sampler(sampler)
        if not sampler.greedy and not caps.seed and SEEDS_NOTE not in not_checked:
            not_checked.append(SEEDS_NOTE)

    def start(model: Any, options: ScanOptions, ids: Any, log: Callable[[str], None]) -> tuple:
        about = {"backend": "endpoint", "server": caps.server, "model": backend.model_name, "not_checked": not_checked}
        return backend_batches(backend, concurrency or caps.concurrency), about

    return ScanEngine(f"the {caps.server} server", check, start)


LOOP_EXAMPLES = 5  # generations per setting in LoopScans.to_dict(with_records=False)
EXAMPLE_KEYS = ("prompt", "text", "period", "near_period", "near_match", "degenerate", "unit_text")


@dataclass
class LoopScans:
    """One scan per decoding setting of the same prompts (``genprobe loops scan``), with how they were run."""

    model: str
    prompts: int
    prompt_source: str
    max_new_tokens: int
    end_token: dict[str, Any]
    backend: dict[str, Any]  # {"backend": "genprobe"} or {"backend": "vllm", "vllm": engine description}
    calibration: LoopCalibration | None
    scans: dict[str, ScanResult] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # wall-clock seconds per setting

    def to_dict(self, with_records: bool = True) -> dict[str, Any]:
        """``loops scan --out``'s scan.json; without records, ``loops scan --json`` (with the first generations)."""
        scans = {name: res.to_dict(with_records) for name, res in self.scans.items()}
        for name, res in self.scans.items() if not with_records else ():
            scans[name]["examples"] = [{k: json_safe(r)[k] for k in EXAMPLE_KEYS} for r in res.records[:LOOP_EXAMPLES]]
        about = {k: getattr(self, k) for k in ("model", "prompts", "prompt_source", "max_new_tokens", "end_token")}
        return about | self.backend | {"calibration": json_safe(self.calibration), "scans": scans}


def loop_study_settings(model: Any, setting: str = "both") -> dict[str, SamplerConfig]:
    """The named decoding settings of the loop studies: ``"both"`` (chanting and plain greedy), or one of them."""
    both = {"chanting": chanting_sampler(model.unk_id), "greedy": greedy_sampler()}
    if setting not in ("both", *both):
        raise ValueError(f"setting must be one of ['both', 'chanting', 'greedy'], got {setting!r}")
    return both if setting == "both" else {setting: both[setting]}


def scan_loop_settings(
    model: Any,
    prompts: Sequence[str] | None = None,
    settings: Mapping[str, SamplerConfig | None] | None = None,
    options: ScanOptions | None = None,
    *,
    calibration: LoopCalibration | None = None,
    chars_unit: bool | None = None,
    prompt_source: str | None = None,
    backend: ScanEngine | Backend | None = None,
    log: Callable[[str], None] = lambda msg: None,
    on_scan: Callable[[str, ScanResult, float], None] | None = None,
    compile: bool = False,
) -> LoopScans:
    """Scan the same prompts under each named decoding setting (``genprobe loops scan``; the arguments: docs/API.md).
    ``settings``: name -> sampler (None: ``options.sampler`` or chanting; default :func:`loop_study_settings`);
    ``backend``: a :class:`ScanEngine` or any :class:`~genprobe.engine.backend.Backend` (default our engine)."""
    if compile and backend is not None:
        raise ValueError("compile=True is for genprobe's own engine; the backend given decodes its own way")
    options = options or ScanOptions()
    options = study_options(model, replace(options, loop=detector_settings(calibration, options.loop)))
    prompt_source = prompt_source or ("tang-heldout-openings" if prompts is None else "prompts")
    texts = list(prompts) if prompts is not None else default_prompts(model, 256)
    chosen = dict(settings) if settings is not None else loop_study_settings(model)
    if not chosen:
        raise ValueError("no decoding settings to scan")
    default = options.sampler or chanting_sampler(model.unk_id)
    samplers = {name: study_sampler(sampler or default, model.eos_id) for name, sampler in chosen.items()}
    ids = encode_prompts(model, texts)
    end = options.end_token
    if end.banned:
        log(f"note: {end.note}")
    if backend is None:
        # "compile" only when asked: the JSON of an eager scan is the one every backend writes
        generate = engine_batches(model, compile)
        about: dict[str, Any] = {"backend": "genprobe"} | ({"compile": True} if compile else {})
    else:
        engine = backend if isinstance(backend, ScanEngine) else backend_engine(backend)
        n_ctx = max(len(p) for p in ids) + options.max_new_tokens
        for name, sampler in samplers.items():
            try:
                engine.check(sampler, model, n_ctx)
            except ValueError as exc:
                raise type(exc)(f"{engine.name} cannot run the {name!r} setting exactly: {exc}") from None
        generate, about = engine.start(model, options, ids, log)
    n_new, source = options.max_new_tokens, str(model.source)
    result = LoopScans(source, len(texts), prompt_source, n_new, json_safe(end), about, calibration)

    for name, sampler in samplers.items():
        t0 = time.perf_counter()
        res = scan_batches(generate, ids, replace(options, sampler=sampler, desc=name), texts)
        res = annotate_scan(res, calibration, chars_unit)
        result.scans[name], result.seconds[name] = res, time.perf_counter() - t0
        if on_scan is not None:
            on_scan(name, res, result.seconds[name])
    return result


def _pct(x: float) -> str:
    return f"{100 * x:5.1f}%"


def _ci(rate: float, ci: Sequence[float]) -> str:
    return f"{_pct(rate)}  [{100 * ci[0]:.1f}–{100 * ci[1]:.1f}]"


def _ci_of(key: str) -> Callable[[LoopRates], str]:
    return lambda s: _ci(getattr(s, key), getattr(s, f"{key}_ci95"))


CI_ROWS = (  # (label, a LoopRates rate with a 95% CI, its human_fpr key)
    ("exact loop rate", "loop_rate", "exact"),
    ("near-loop rate", "near_loop_rate", "near"),
    ("exact or near", "any_loop_rate", "any_loop"),
    ("repetitive tail", "repetitive_rate", "repetitive"),
    ("degenerate (any of them)", "degenerate_rate", "degenerate"),
)


def scan_table(summary: LoopRates, title: str = "") -> str:
    """A short human-readable table: tokens, characters where they are the unit, and calibrated human rates."""
    show_chars = summary.chars is not None and summary.chars_unit is not False
    cols = [("tokens", summary)] + ([("chars", summary.chars)] if show_chars and summary.chars is not None else [])
    human = summary.human_fpr or {}
    rows: list[tuple[str, Callable[[LoopRates], str], str]] = [(label, _ci_of(key), h) for label, key, h in CI_ROWS]
    short = f"  short (≤{summary.short_period_max}) exact/any"
    rows += [
        (short, lambda s: f"{_pct(s.short_loop_rate)} / {_pct(s.short_any_rate)}", ""),
        ("  long exact/any", lambda s: f"{_pct(s.long_loop_rate)} / {_pct(s.long_any_rate)}", ""),
        ("mean distinct-2", lambda s: f"{s.mean_distinct_2:.3f}", ""),
        ("mean seq-rep-4", lambda s: f"{s.mean_seq_rep_4:.3f}", ""),
        ("mean tail compression", lambda s: f"{s.mean_tail_compression:.2f}", ""),
        ("mean longest repeat", lambda s: f"{s.mean_longest_repeat:.1f}", ""),
    ]
    lines = [title] if title else []
    lines.append(f"  generations {summary.n}; hit the length limit {_pct(summary.length_capped_rate or 0.0)}")
    head = "human text (held out)" if summary.human_fpr is not None else ""
    lines.append("  " + " " * 30 + "".join(f"{name:<28}" for name, _ in cols) + head)
    for label, fmt, key in rows:
        h = human.get(key)
        lines.append(
            f"  {label:<30}" + "".join(f"{fmt(s):<28}" for _, s in cols) + (_ci(h["rate"], h["ci95"]) if h else "")
        )
    for name, s in cols:
        lines.append(f"  periods ({name}): exact {s.period_hist}; near {s.near_period_hist}")
    if summary.chars is not None and not show_chars:
        lines.append("  characters: not shown (" + CHARS_NOT_UNIT_NOTE.split(": ", 1)[1] + ")")
    return "\n".join(lines).rstrip()
