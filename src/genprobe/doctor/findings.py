"""A finding of ``genprobe doctor``: one check's outcome, its evidence, the criterion it was judged by and the
command that reproduces it alone. The worst severity found (``ok`` < ``info`` < ``warning`` < ``bug``) is the run's
verdict and its exit status, which gates a release in CI (docs/doctor.md: the exit statuses and what raises each)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SEVERITIES = ("ok", "info", "warning", "bug")  # ordered: a verdict is the worst severity found


@dataclass
class Finding:
    """One check: ``stage`` (card, inference, attention, degeneration, fixes), ``check`` (a short id such as
    ``tokenizer.round_trip``), ``severity``, a one-line ``title``, the ``evidence`` behind it, the ``criterion``
    that turned the evidence into the severity and the ``command`` that reproduces the check alone."""

    stage: str
    check: str
    severity: str
    title: str
    evidence: dict[str, Any] = field(default_factory=dict)
    criterion: str | None = None
    command: str | None = None

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {self.severity!r}")


EXIT_HEALTHY, EXIT_BUG, EXIT_BAD_INPUT, EXIT_WARNINGS = 0, 1, 2, 4
VERDICTS = {
    "ok": ("healthy", EXIT_HEALTHY),
    "info": ("healthy", EXIT_HEALTHY),
    "warning": ("warnings", EXIT_WARNINGS),
    "bug": ("bug", EXIT_BUG),
}


@dataclass
class Verdict:
    """The run's verdict (healthy, warnings, bug), its exit status and the findings that decided it."""

    verdict: str
    exit_status: int
    bugs: list[str]
    warnings: list[str]


def verdict_of(findings: list[Finding]) -> Verdict:
    """The worst severity decides: a bug → 1, a warning → 4, else 0."""
    name, code = VERDICTS[max((f.severity for f in findings), key=SEVERITIES.index, default="ok")]
    bugs, warnings = ([f.title for f in findings if f.severity == s] for s in ("bug", "warning"))
    return Verdict(name, code, bugs, warnings)
