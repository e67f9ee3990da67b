"""One self-contained, offline ``report.html``: our numbers beside the chapter's, figures, interactive pages, from
``templates/`` with CSS, JS, the case data (a JSON script block) and the figures (base64 PNG) inlined."""

from __future__ import annotations

from pathlib import Path

from .._io import atomic_write_text
from .._templates import environment
from .claims import case_claims
from .headline import headline_rows


def render_report(case: dict, seed: dict, figures: dict[str, bytes]) -> str:
    """The report as one HTML string (``figures``: name → PNG bytes, inlined)."""
    meta = case.get("meta", {})
    return (
        environment("genprobe.report")
        .get_template("report.html.j2")
        .render(
            case=case,
            seed=seed,
            figs=figures,
            meta=meta,
            seconds=meta.get("seconds", {}),
            headline=headline_rows(case, seed),
            findings=case_claims(case),
            data={k: case[k] for k in ("sampling", "cache_timing") if k in case},  # what the page's JavaScript reads
        )
    )


def write_report(case: dict, out_dir: Path, seed: dict, figures: dict[str, bytes]) -> Path:
    """Write ``report.html`` into ``out_dir`` atomically and return its path."""
    atomic_write_text(out_dir / "report.html", render_report(case, seed, figures))
    return out_dir / "report.html"
