"""Several decoding settings of one loop scan (``genprobe loops scan``): :func:`scan_loop_settings` and its result
:class:`LoopScans`. Who generates is genprobe's engine by default, else a :class:`ScanEngine`: any
:class:`~genprobe.engine.backend.Backend` (:func:`backend_engine`; a live server, a test's fake) or an engine's
in-process fast path (:func:`genprobe.serving.scan.vllm_scan_backend`,
:func:`genprobe.serving.llamacpp.scan.llamacpp_scan_backend`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

from .._io import json_safe
from ..corpus.inputs import default_prompts
from ..engine.backend import Backend, check_api_sampler
from ..engine.samplers.stages import SamplerConfig
from ..metrics.calibrate import LoopCalibration
from .scan import (
    GenerateBatch,
    ScanOptions,
    ScanResult,
    annotate_scan,
    backend_batches,
    chanting_sampler,
    detector_settings,
    end_token,
    engine_batches,
    greedy_sampler,
    scan_batches,
    study_sampler,
)
from .study import encode_prompts, study_options


@dataclass(frozen=True)
class ScanEngine:
    """Who generates a scan other than genprobe's engine; an engine contributes just these two functions.

    ``check(sampler, model, n_ctx)`` raises a ``ValueError`` for a setting it cannot run exactly (the sampler with
    the end-token ban, the context the scan needs): called for every setting before anything starts, so a setting is
    refused, never approximated. ``start(model, options, ids, log)`` starts the engine for the scan's prompt ids and
    returns the batch generator of :func:`~genprobe.loops.scan.scan_batches` and what the JSON says about it."""

    name: str  # as messages name it: "vLLM", "llama.cpp", "the vllm server"
    check: Callable[[SamplerConfig, Any, int], None]
    start: Callable[[Any, ScanOptions, Sequence[Sequence[int]], Callable[[str], None]], tuple[GenerateBatch, dict]]


SEEDS_NOTE = "reproducibility: the server ignores per-request seeds, so a sampled setting differs run to run"


def backend_engine(backend: Backend, concurrency: int | None = None, kind: str = "endpoint") -> ScanEngine:
    """Any :class:`~genprobe.engine.backend.Backend` as a scan engine, ``concurrency`` requests in flight (default:
    as many as it serves at once). The sampler is passed through as the backend's own (temperature, top-p, top-k,
    a seed per prompt, banned ids); the JSON names the server and lists what its capabilities left unchecked."""
    caps = backend.capabilities
    not_checked = []
    if not caps.token_prompts:
        not_checked.append(f"prompt ids: the {caps.server} server tokenizes the prompt texts itself")

    def check(sampler: SamplerConfig, model: Any, n_ctx: int) -> None:
        check_api_sampler(sampler)
        if not sampler.greedy and not caps.seed and SEEDS_NOTE not in not_checked:
            not_checked.append(SEEDS_NOTE)

    def start(model: Any, options: ScanOptions, ids: Any, log: Callable[[str], None]) -> tuple:
        generate = backend_batches(backend, concurrency or caps.concurrency)
        about = {"backend": kind, "server": caps.server, "model": backend.model_name, "not_checked": not_checked}
        return generate, about

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
        """Plain JSON: ``loops scan --out``'s scan.json (every record); without records, ``loops scan --json``
        (each setting's settings, summary and its first generations as examples)."""
        scans = {name: res.to_dict(with_records) for name, res in self.scans.items()}
        for name, res in self.scans.items():
            if not with_records:
                scans[name]["examples"] = [
                    {k: json_safe(r)[k] for k in EXAMPLE_KEYS} for r in res.records[:LOOP_EXAMPLES]
                ]
        about = {k: getattr(self, k) for k in ("model", "prompts", "prompt_source", "max_new_tokens", "end_token")}
        return about | self.backend | {"calibration": json_safe(self.calibration), "scans": scans}


def loop_study_settings(model: Any, setting: str = "both") -> dict[str, SamplerConfig]:
    """The named decoding settings of the loop studies: ``"both"`` (chanting — greedy, unknown token banned — and
    plain greedy), ``"chanting"`` or ``"greedy"``; the end token is banned by the scan itself."""
    table = {
        "both": {"chanting": chanting_sampler(model.unk_id), "greedy": greedy_sampler()},
        "chanting": {"chanting": chanting_sampler(model.unk_id)},
        "greedy": {"greedy": greedy_sampler()},
    }
    if setting not in table:
        raise ValueError(f"setting must be one of {sorted(table)}, got {setting!r}")
    return table[setting]


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
    """Scan the same prompts under each named decoding setting (what ``genprobe loops scan`` runs).

    ``settings`` maps a name to a sampler (None: the loop studies' default; default: :func:`loop_study_settings`'s
    chanting and greedy); the end token is banned in every one. ``prompts`` defaults to 256 held-out Tang
    openings for the bundled char model; ``prompt_source`` says where they came from (JSON). ``options`` sets the
    length, batch, seed, progress and detector settings (the model fills in its end and unknown tokens and decoder);
    ``calibration`` fixes the detector settings and puts its human rates beside every rate; ``chars_unit`` says
    whether the per-character view is a verdict (default: the calibration's). ``backend`` is who generates: a
    :class:`ScanEngine` or any :class:`~genprobe.engine.backend.Backend` (default our engine); every setting is
    checked before it starts (one it cannot run exactly is refused, never approximated). ``log`` gets the end-token
    note (and the engine's start-up); ``on_scan(name, result, seconds)`` each scan as it finishes.
    ``compile=True``: our engine decodes through the compiled fast path (no other backend).
    """
    if compile and backend is not None:
        raise ValueError("compile=True is for genprobe's own engine; the backend given decodes its own way")
    options = options or ScanOptions()
    options = study_options(model, replace(options, loop=detector_settings(calibration, options.loop)))
    if prompt_source is None:
        prompt_source = "tang-heldout-openings" if prompts is None else "prompts"
    texts = list(prompts) if prompts is not None else default_prompts(model, 256)
    chosen = dict(settings) if settings is not None else loop_study_settings(model)
    if not chosen:
        raise ValueError("no decoding settings to scan")
    default = options.sampler or chanting_sampler(model.unk_id)
    samplers = {name: study_sampler(sampler or default, model.eos_id) for name, sampler in chosen.items()}
    ids = encode_prompts(model, texts)
    end = end_token(options)
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
