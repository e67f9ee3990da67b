"""``report.html``: the doctor's findings as one offline page, rendered from ``templates/doctor.html.j2`` in the
Jinja environment every genprobe page uses (:mod:`genprobe._templates`), CSS and JS inlined from ``assets/``."""

from __future__ import annotations

from typing import Any

from .._io import json_safe
from .._templates import environment
from .options import TITLES

SEVERITY_CLASS = {"ok": "ok", "info": "info", "warning": "warn", "bug": "bug"}


def heat(x: float | None) -> str:
    """A value in [0, 1] as a CSS colour (white → deep blue; grey when undefined)."""
    if x is None or x != x:
        return "#ddd"
    v = max(0.0, min(1.0, float(x)))
    return f"rgb({int(255 - 215 * v)},{int(255 - 165 * v)},{int(255 - 55 * v)})"


def render_html(rep: Any) -> str:
    """The page of a :class:`~genprobe.doctor.run.DoctorReport` as one HTML string."""
    d = json_safe(rep)
    stages = {s.name: s for s in rep.stages}
    env = environment("genprobe.doctor")
    return env.get_template("doctor.html.j2").render(
        r=d,
        rep=rep,
        titles=TITLES,
        stages=stages,
        sev=SEVERITY_CLASS,
        heat=heat,
        grid=rep.attention.grid() if rep.attention is not None else [],
        calibration=_calibration(rep),
    )


def _calibration(rep: Any) -> Any:
    """The calibration's one-line description, or the reason there is none."""
    deg = rep.degeneration
    if deg is None:
        return None
    if deg.calibration is None:
        return f"detectors not calibrated ({deg.calibration_error}): raw settings, no human false-positive rate"
    return deg.calibration.describe()
