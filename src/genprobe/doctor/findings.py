"""A finding of ``genprobe doctor``: one check's outcome, its evidence, the criterion it was judged by and the
command that reproduces it alone. Severities, from harmless to fatal: ``ok``, ``info``, ``warning``, ``bug``."""

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


def worst_severity(findings: list[Finding]) -> str:
    """The most severe severity among ``findings`` (``ok`` when there are none)."""
    return max((f.severity for f in findings), key=SEVERITIES.index, default="ok")
