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


_CALIBRATIONS: dict[tuple[Any, ...], LoopCalibration] = {}  # (tokenizer, length, script) -> calibration, per process


def degeneration(run: DoctorRun) -> Degeneration:
    """Scan the prompts under greedy and the user's settings (else the model card's generation defaults when they
    sample), calibrated; the end-of-text behaviour; findings."""
    model, prompts, source, opts, log = run.model, run.prompts(), run.inputs.source, run.opts, run.note
    gen = run.report.card.generation_defaults if run.report.card is not None else None
    b, chat = opts.plan, " --chat" if opts.chat else ""
    # greedy, and the user's sampler (else the model's generation defaults, transformers' semantics, when they sample)
    named = {GREEDY: (greedy_sampler(), ["--setting", "greedy"])}
    if opts.sampling is not None:
        named[YOURS] = (opts.sampling, ["--setting", "sample", *opts.sampling_flags])
    elif gen and gen.get("do_sample"):
        keys = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")  # each the sampler flag --top-k, ...
        given = {k: gen[k] for k in keys if gen.get(k) is not None}
        flags = [w for k, v in given.items() for w in ("--" + k.replace("_", "-"), str(v))]
        named[DEFAULTS] = (SamplerConfig.preset("hf", **given), ["--setting", "sample", "--preset", "hf", *flags])
    settings = {k: v[0] for k, v in named.items()}
    calibration: LoopCalibration | None = None
    cal_error: str | None = None
    key = (vocab_key(model), model.unk_id, b.scan_tokens, is_cjk(prompts))
    try:  # detectors calibrated on human text of the prompts' language
        if key not in _CALIBRATIONS:
            _CALIBRATIONS[key] = calibrate_for_scan(model.tokenizer, b.scan_tokens, prompts, unk_id=model.unk_id)
        calibration = _CALIBRATIONS[key]
    except (ValueError, FileNotFoundError) as exc:  # that text is unavailable: the reason
        cal_error = f"{type(exc).__name__}: {exc}"
        log(f"  detectors not calibrated: {cal_error}")
    texts = [model.chat_prompt(p) for p in prompts] if opts.chat else list(prompts)
    where, scan = source + (" (chat template)" if opts.chat else ""), ScanOptions(b.scan_tokens, seed=opts.seed)
    scans = scan_loop_settings(model, texts, settings, scan, calibration=calibration, prompt_source=where, log=log)
    eot: EndOfText | None = None
    found: list[Finding] = []
    if model.eos_id is not None and (few := texts[: b.eos_prompts]):  # how many end before the limit when allowed to
        runs = {k: complete(model, few, s, b.scan_tokens, opts.seed, stop_at_eos=True) for k, s in settings.items()}
        ended = {k: sum(c.finished == "eos" for c in v) for k, v in runs.items()}
        eot = EndOfText(int(model.eos_id), b.scan_tokens, ended, len(few))
        d = json_safe(eot)
        rates = ", ".join(f"{k} {v['rate']:.0%}" for k, v in d["settings"].items())
        title = f"with the end token allowed, generations end within {b.scan_tokens} tokens: {rates}"
        crit = "share of generations that emit the end-of-text token before the limit (reported; never ending is info)"
        cmd = f"genprobe generate {run.arg} --greedy --max-new-tokens {b.scan_tokens}{chat} --prompt "
        cmd += shlex.quote(prompts[0])
        sev = "ok" if any(eot.ended.values()) else "info"
        found.append(Finding("degeneration", "end_of_text", sev, title, d, crit, cmd))
    res = Degeneration(list(prompts), source, opts.chat, settings, scans, calibration, cal_error, eot)
    base = f"genprobe loops scan {run.arg} {opts.prompts_arg()} --max-new-tokens {b.scan_tokens}{chat}"
    base += " --no-calibrate" if calibration is None else ""
    res.findings = [_rate_finding(res, k, opts, base + " " + shlex.join(named[k][1])) for k in named] + found
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
