"""``genprobe doctor``: every check in one run, stage by stage with a progress line each, one
:class:`DoctorReport` (``doctor.json`` + ``report.html``) and a verdict whose exit status gates a release."""

from __future__ import annotations

import shlex
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, cast

from .._io import json_safe
from ..model.load import Model
from .attention_health import AttentionHealth, attention_health
from .audit import ModelFiles, StaticAudit, audit_stage
from .card import ModelCard, model_card
from .degeneration import Degeneration, degeneration
from .fixes import FixComparison, compare
from .inference import InferenceCheck, check_inference
from .options import QUICK_SKIP, TITLES, DoctorOptions, DoctorRun, Finding, StageSkipped, Verdict, doctor_inputs
from .quality import Quality, quality_stage

PROMPTS_FILE, JSON_FILE, HTML_FILE = "prompts.txt", "doctor.json", "report.html"


@dataclass
class StageRun:
    """How one stage went: ``ran``, ``skipped`` (with the reason) or ``error`` (the exception, reported)."""

    name: str
    status: str
    seconds: float
    note: str | None = None


@dataclass
class DoctorReport:
    """Everything one doctor run found: each stage's typed result (None when not run), timings, the verdict."""

    model: str
    options: DoctorOptions
    audit: StaticAudit | None = None
    card: ModelCard | None = None
    quality: Quality | None = None
    inference: InferenceCheck | None = None
    attention: AttentionHealth | None = None
    degeneration: Degeneration | None = None
    fixes: FixComparison | None = None
    stages: list[StageRun] = field(default_factory=list)
    errors: list[Finding] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)

    @property
    def findings(self) -> list[Finding]:
        """Every finding, stage by stage (stage errors last)."""
        parts = [getattr(self, name) for name in TITLES]
        return [f for p in parts if p is not None for f in p.findings] + self.errors

    @property
    def verdict(self) -> Verdict:
        """Healthy / warnings / bug and the exit status."""
        return Verdict.of(self.findings)

    @property
    def exit_status(self) -> int:
        """0 healthy, 1 bug, 4 warnings only."""
        return self.verdict.exit_status

    def to_dict(self) -> dict[str, Any]:
        """``doctor.json``: strict JSON."""
        from .._version import __version__

        head = {"genprobe": __version__, "model": self.model, "options": self.options, **json_safe(self.verdict)}
        results = {name: getattr(self, name) for name in TITLES}
        return json_safe(head | {"stages": self.stages, "findings": self.findings} | results | {"files": self.files})


#: Each stage's job, in TITLES order: it takes the run and returns its result or raises StageSkipped.
STAGE_JOBS: dict[str, Callable[[DoctorRun], Any]] = dict(
    zip(
        TITLES,
        (audit_stage, model_card, quality_stage, check_inference, attention_health, degeneration, compare),
        strict=True,
    )
)


def run_doctor(
    model: Model | ModelFiles,
    opts: DoctorOptions,
    *,
    model_arg: str | None = None,
    out: str | Path | None = None,
    log: Callable[[str], None] = lambda msg: None,
) -> DoctorReport:
    """Run the stages of ``opts.only`` on ``model`` (its files alone for ``--only audit``); with ``out``, write
    prompts.txt, doctor.json and report.html."""
    from .._io import atomic_write_json, atomic_write_text
    from .._templates import environment

    model = cast(Model, model)  # ModelFiles has the source, and no tokenizer: all the audit stage and the inputs read
    arg = model_arg or (str(model.source) if model.source else "MODEL")
    rep = DoctorReport(arg, opts)
    inp = doctor_inputs(model, opts)
    out = None if out is None else Path(out)
    if out is not None and inp.prompts:  # a reproducing command names prompts.txt only when it is written
        opts.prompts_file = rep.files["prompts"] = str(out / PROMPTS_FILE)
        atomic_write_text(out / PROMPTS_FILE, "\n".join(p.replace("\n", " ") for p in inp.prompts) + "\n")
    run = DoctorRun(model, opts, inp, shlex.quote(arg), log, rep)
    chosen = [s for s in TITLES if s in opts.only]
    for i, name in enumerate(chosen, 1):
        log(f"[{i}/{len(chosen)}] {TITLES[name]} …")
        t0 = time.perf_counter()
        try:
            setattr(rep, name, STAGE_JOBS[name](run))
            status, note = "ran", None
        except StageSkipped as why:
            status, note = "skipped", str(why)
            if note != QUICK_SKIP:  # not checked for want of inputs: said among the findings
                title = f"the {TITLES[name]} stage did not run: {note}"
                rep.errors.append(Finding(name, f"{name}.skipped", "info", title))
        except Exception as exc:  # noqa: BLE001 — one stage failing (user code, a missing corpus) hides no other
            status, note = "error", f"{type(exc).__name__}: {exc}"
            ev = {"exception": type(exc).__name__, "message": str(exc)}
            cmd = f"genprobe doctor {shlex.quote(rep.model)} --only {name} --out DIR"
            title = f"the {TITLES[name]} stage failed: {note}"
            rep.errors.append(Finding(name, f"{name}.error", "warning", title, ev, None, cmd))
        seconds = time.perf_counter() - t0
        rep.stages.append(StageRun(name, status, round(seconds, 2), note))
        found = getattr(rep, name, None)
        got = Counter(f.severity for f in found.findings) if found is not None else {}
        counts = ", ".join(f"{got[k]} {k}" for k in ("bug", "warning", "info", "ok") if got.get(k)) or note
        log(f"[{i}/{len(chosen)}] {TITLES[name]}: {status} in {seconds:.1f} s" + (f" — {counts}" if counts else ""))
    if out is not None:  # the page: templates/doctor.html.j2 in the Jinja environment every genprobe page uses
        rep.files.update(json=str(out / JSON_FILE), html=str(out / HTML_FILE))
        atomic_write_json(out / JSON_FILE, json_safe(rep))
        template = environment("genprobe.doctor").get_template("doctor.html.j2")
        atomic_write_text(out / HTML_FILE, template.render(r=json_safe(rep), rep=rep, titles=TITLES))
    return rep
