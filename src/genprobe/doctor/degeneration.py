"""Degeneration under the user's own settings (:func:`genprobe.loops.scan.scan_loop_settings`, calibrated,
greedy and the user's sampler) and how often a generation ends when the end token is allowed (the scans ban it)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from .._io import NOT_JSON, json_safe
from ..corpus.inputs import vocab_key
from ..engine.loaded import complete
from ..engine.samplers.stages import SamplerConfig
from ..loops.scan import LoopScans, ScanOptions, calibrate_for_scan, greedy_sampler, scan_loop_settings
from ..metrics.calibrate import LoopCalibration
from ..metrics.legit import is_cjk
from ..metrics.stats import wilson_interval
from ..model.load import Model
from .options import DoctorOptions, DoctorRun, Finding

GREEDY, YOURS, DEFAULTS = "greedy", "your sampler", "generation_config"
RATE_EVIDENCE = tuple(
    "n degenerate_rate degenerate_rate_ci95 loop_rate loop_rate_ci95 near_loop_rate near_loop_rate_ci95".split()
)
EVERY_PROMPT = "every generation degenerate (an exact loop, a near loop or a repetitive tail) warns"


@dataclass
class EndOfText:
    """Generations with the end token allowed: how many ended before the limit, per setting."""

    JSON_PROPERTIES = ("settings",)

    eos_id: int
    max_new_tokens: int
    ended: dict[str, int] = field(metadata=NOT_JSON)
    n: int

    @property
    def settings(self) -> dict[str, dict[str, Any]]:
        """Per setting: generations ended, their rate and its Wilson interval."""
        n = self.n
        return {
            k: {"ended": v, "rate": v / n if n else 0.0, "ci95": wilson_interval(v, n)} for k, v in self.ended.items()
        }


@dataclass
class Degeneration:
    """The loop scans of the prompts under each setting, the calibration behind them, the end-token behaviour."""

    prompts: list[str]
    prompt_source: str
    chat: bool
    settings: dict[str, SamplerConfig]
    scans: LoopScans
    calibration: LoopCalibration | None
    calibration_error: str | None
    end_of_text: EndOfText | None
    findings: list[Finding] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON: the scans without their records (settings, summary, first generations as examples)."""
        keys = ("prompts", "prompt_source", "chat", "settings", "calibration_error", "end_of_text", "findings")
        return json_safe({k: getattr(self, k) for k in keys}) | {"scans": self.scans.to_dict(with_records=False)}


def decoding_settings(opts: DoctorOptions, gen: dict[str, Any] | None) -> dict[str, tuple[SamplerConfig, list[str]]]:
    """Greedy, and the user's sampler (else the model's generation defaults, transformers' semantics, when they
    sample), with their flags."""
    out = {GREEDY: (greedy_sampler(), ["--setting", "greedy"])}
    if opts.sampling is not None:
        out[YOURS] = (opts.sampling, ["--setting", "sample", *opts.sampling_flags])
    elif gen and gen.get("do_sample"):
        keys = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")  # each the sampler flag --top-k, ...
        given = {k: gen[k] for k in keys if gen.get(k) is not None}
        flags = [w for k, v in given.items() for w in ("--" + k.replace("_", "-"), str(v))]
        out[DEFAULTS] = (SamplerConfig.preset("hf", **given), ["--setting", "sample", "--preset", "hf", *flags])
    return out


_CALIBRATIONS: dict[tuple[Any, ...], LoopCalibration] = {}  # (tokenizer, length, script) -> calibration, per process


def _calibrate(model: Model, prompts: list[str], tokens: int) -> tuple[LoopCalibration | None, str | None]:
    """Detectors calibrated on human text of the prompts' language; the reason when that text is unavailable."""
    key = (vocab_key(model), model.unk_id, tokens, is_cjk(prompts))
    try:
        if key not in _CALIBRATIONS:
            _CALIBRATIONS[key] = calibrate_for_scan(model.tokenizer, tokens, prompts, unk_id=model.unk_id)
        return _CALIBRATIONS[key], None
    except (ValueError, FileNotFoundError) as exc:
        return None, f"{type(exc).__name__}: {exc}"


def end_of_text(model: Model, texts: list[str], settings: dict[str, SamplerConfig], tokens: int, seed: int) -> Any:
    """How many generations end before ``tokens`` when the end token is allowed (None: the model has none)."""
    if model.eos_id is None or not texts:
        return None
    runs = {name: complete(model, texts, s, tokens, seed, stop_at_eos=True) for name, s in settings.items()}
    ended = {name: sum(1 for c in outs if c.finished == "eos") for name, outs in runs.items()}
    return EndOfText(int(model.eos_id), tokens, ended, len(texts))


def degeneration(run: DoctorRun) -> Degeneration:
    """Scan the prompts under greedy and the user's settings (else the model card's generation defaults when they
    sample), calibrated; the end-of-text behaviour; findings."""
    model, prompts, source, opts, log = run.model, run.prompts(), run.inputs.source, run.opts, run.note
    gen = run.report.card.generation_defaults if run.report.card is not None else None
    b = opts.plan
    named = decoding_settings(opts, gen)
    settings = {k: v[0] for k, v in named.items()}
    calibration, cal_error = _calibrate(model, prompts, b.scan_tokens)
    if cal_error:
        log(f"  detectors not calibrated: {cal_error}")
    texts = [model.chat_prompt(p) for p in prompts] if opts.chat else list(prompts)
    where, scan = source + (" (chat template)" if opts.chat else ""), ScanOptions(b.scan_tokens, seed=opts.seed)
    scans = scan_loop_settings(model, texts, settings, scan, calibration=calibration, prompt_source=where, log=log)
    eot = end_of_text(model, texts[: b.eos_prompts], settings, b.scan_tokens, opts.seed)
    res = Degeneration(list(prompts), source, opts.chat, settings, scans, calibration, cal_error, eot)
    base = f"genprobe loops scan {run.arg} {opts.prompts_arg()} --max-new-tokens {b.scan_tokens}"
    base += " --chat" if opts.chat else ""
    base += " --no-calibrate" if calibration is None else ""
    res.findings = [_rate_finding(res, k, opts, base + " " + shlex.join(named[k][1])) for k in named]
    res.findings += _eot_findings(res, run.arg, opts.chat)
    return res


def _rate_finding(res: Degeneration, name: str, opts: DoctorOptions, command: str) -> Finding:
    r = res.scans.scans[name].summary
    fpr = (r.human_fpr or {}).get("degenerate", {})
    ev = {"setting": name, **{k: getattr(r, k) for k in RATE_EVIDENCE}, "max_loop_rate": opts.max_loop_rate}
    ev |= {"human_fpr": fpr.get("rate"), "human_fpr_ci95": fpr.get("ci95")}
    lo, hi = r.degenerate_rate_ci95
    title = (
        f"{name}: degenerate {r.degenerate_rate:.1%} [{lo:.1%}–{hi:.1%}] of {r.n}, exact loops "
        f"{r.loop_rate:.1%}, near loops {r.near_loop_rate:.1%}"
    )
    if fpr.get("rate") is not None:
        title += f"; human text flagged {fpr['rate']:.1%}"
    crit = EVERY_PROMPT
    sev = "info"
    if opts.max_loop_rate is not None:
        crit += f"; a degenerate rate above --max-loop-rate {opts.max_loop_rate:g} warns"
        sev = "warning" if r.degenerate_rate > opts.max_loop_rate else "ok"
    if r.n and r.degenerate == r.n:
        sev, title = "warning", f"{name}: every generation degenerates ({r.n} of {r.n}); " + title.split(": ", 1)[1]
    return Finding("degeneration", f"loops.{name}", sev, title, ev, crit, command)


def _eot_findings(res: Degeneration, model_arg: str, chat: bool) -> list[Finding]:
    e = res.end_of_text
    if e is None:
        return []
    d = json_safe(e)
    parts = [f"{k} {v['rate']:.0%}" for k, v in d["settings"].items()]
    never = all(v == 0 for v in e.ended.values())
    title = f"with the end token allowed, generations end within {e.max_new_tokens} tokens: " + ", ".join(parts)
    crit = "share of generations that emit the end-of-text token before the limit (reported; never ending is info)"
    cmd = f"genprobe generate {model_arg} --greedy --max-new-tokens {e.max_new_tokens}" + (" --chat" if chat else "")
    cmd += " --prompt " + shlex.quote(res.prompts[0])
    return [Finding("degeneration", "end_of_text", "info" if never else "ok", title, d, crit, cmd)]
