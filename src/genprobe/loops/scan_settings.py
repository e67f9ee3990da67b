"""Several decoding settings of one loop scan (``genprobe loops scan``): :func:`scan_loop_settings` and its result
:class:`LoopScans`; the generation backend is a callback (our engine by default, vLLM through
:func:`genprobe.serving.scan.vllm_scan_backend`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from .._io import json_safe
from ..corpus.inputs import default_prompts
from ..engine.samplers import SamplerConfig
from ..metrics import LoopCalibration, LoopSettings
from .scan import ScanResult, annotate_scan, chanting_sampler, greedy_sampler
from .study import LoopStudy, RepairConfig

# (ids, texts, *, sampler, desc) -> ScanResult
ScanFunction = Callable[..., ScanResult]
# (model, study, samplers, ids, log) -> (scan function, what the JSON says about the backend)
ScanBackend = Callable[
    [Any, LoopStudy, dict[str, SamplerConfig], Sequence[Sequence[int]], Callable[[str], None]],
    tuple[ScanFunction, dict[str, Any]],
]


LOOP_EXAMPLES = 5  # generations per setting in LoopScans.to_dict(with_records=False)


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
        scans: dict[str, Any] = {}
        for name, res in self.scans.items():
            if with_records:
                scans[name] = json_safe(res)
                continue
            examples = [
                {
                    "prompt": r.prompt,
                    "text": r.text,
                    "period": r.measures.period,
                    "near_period": r.measures.near_period,
                    "near_match": r.measures.near_match,
                    "degenerate": r.degenerate,
                    "unit_text": r.unit_text,
                }
                for r in res.records[:LOOP_EXAMPLES]
            ]
            scans[name] = {"settings": json_safe(res.settings), "summary": json_safe(res.summary), "examples": examples}
        return {
            "model": self.model,
            "prompts": self.prompts,
            "prompt_source": self.prompt_source,
            "max_new_tokens": self.max_new_tokens,
            "end_token": self.end_token,
            **self.backend,
            "calibration": json_safe(self.calibration) if self.calibration is not None else None,
            "scans": scans,
        }


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
    *,
    max_new_tokens: int = 57,
    batch_size: int = 64,
    seed: int = 0,
    progress: bool = False,
    calibration: LoopCalibration | None = None,
    loop: LoopSettings | None = None,
    chars_unit: bool | None = None,
    prompt_source: str | None = None,
    backend: ScanBackend | None = None,
    log: Callable[[str], None] = lambda msg: None,
    on_scan: Callable[[str, ScanResult, float], None] | None = None,
    compile: bool = False,
) -> LoopScans:
    """Scan the same prompts under each named decoding setting (what ``genprobe loops scan`` runs).

    ``settings`` maps a name to a sampler (None: the loop studies' default; default: :func:`loop_study_settings`'s
    chanting and greedy); the end token is banned in every one. ``prompts`` defaults to 256 held-out Tang
    openings for the bundled char model; ``prompt_source`` says where they came from (JSON). ``calibration``
    fixes the detector settings and puts its human rates beside every rate (else ``loop``); ``chars_unit`` says
    whether the per-character view is a verdict (default: the calibration's). ``backend(model, study, samplers,
    ids, log)`` returns who generates — a scan function ``(ids, texts, *, sampler, desc) -> ScanResult`` — and what
    the JSON says about it; default our engine; :func:`genprobe.serving.scan.vllm_scan_backend` is vLLM's (every
    setting checked first: one vLLM cannot express exactly is refused, never approximated). ``log`` gets the
    end-token note (and the engine's start-up); ``on_scan(name, result, seconds)`` each scan as it finishes.
    ``compile=True``: our engine decodes through the compiled fast path (no other backend).
    """
    if compile and backend is not None:
        raise ValueError("compile=True is for genprobe's own engine; the backend given decodes its own way")
    loop = _detector_settings(calibration, loop)
    if prompt_source is None:
        prompt_source = "tang-heldout-openings" if prompts is None else "prompts"
    texts = list(prompts) if prompts is not None else default_prompts(model, 256)
    chosen = dict(settings) if settings is not None else loop_study_settings(model)
    if not chosen:
        raise ValueError("no decoding settings to scan")
    study = _loop_study(model, loop, max_new_tokens, batch_size, seed, progress, compile)
    samplers = {name: sampler or study.sampler for name, sampler in chosen.items()}
    ids = study.encode(texts)
    end = study.end_token
    if end.banned:
        log(f"note: {end.note}")
    if backend is None:
        # "compile" only when asked: the JSON of an eager scan is the one every backend writes
        scan, about = study.scan, {"backend": "genprobe"} | ({"compile": True} if compile else {})
    else:
        scan, about = backend(model, study, samplers, ids, log)
    result = LoopScans(str(model.source), len(texts), prompt_source, max_new_tokens, json_safe(end), about, calibration)

    for name, sampler in samplers.items():
        t0 = time.perf_counter()
        res = annotate_scan(scan(ids, texts, sampler=sampler, desc=name), calibration, chars_unit)
        result.scans[name], result.seconds[name] = res, time.perf_counter() - t0
        if on_scan is not None:
            on_scan(name, res, result.seconds[name])
    return result


def _detector_settings(calibration: LoopCalibration | None, loop: LoopSettings | None) -> LoopSettings | None:
    """The loop detector's settings: the calibration's when one is given (``loop`` may only repeat them)."""
    if calibration is None:
        return loop
    if loop is not None and loop != calibration.settings:
        raise ValueError("give either loop settings or a calibration (which fixes them), not both")
    return calibration.settings


def _loop_study(
    model: Any,
    loop: LoopSettings | None,
    max_new_tokens: int,
    batch_size: int,
    seed: int,
    progress: bool,
    compile: bool = False,
) -> LoopStudy:
    """The study that encodes the prompts and scans them (generation length, batch, seed, detector settings)."""
    cfg = RepairConfig(max_new_tokens=max_new_tokens, batch_size=batch_size, seed=seed)
    if loop is not None:
        cfg.loop = loop
    return LoopStudy(model, cfg, progress=progress, compile=compile)
