"""The verdict and the exit status that gates a release in CI: 0 healthy, 1 a bug found (a cache path that
disagrees with recomputation, a padding leak, a broken tokenizer round trip, a user implementation that raises),
4 warnings only (e.g. a loop rate above ``--max-loop-rate``), 2 bad input (the CLI's usage errors)."""

from __future__ import annotations

from dataclasses import dataclass

from .findings import Finding, worst_severity

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
    name, code = VERDICTS[worst_severity(findings)]
    return Verdict(
        name,
        code,
        [f.title for f in findings if f.severity == "bug"],
        [f.title for f in findings if f.severity == "warning"],
    )
