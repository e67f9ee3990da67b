"""One self-contained, offline ``report.html``: our numbers beside those published in the chapter
《训练与推理的两副面孔》 ("The two faces of training and inference"), figures, interactive pages.

The page is rendered from the Jinja2 templates in ``templates/`` (autoescaped); CSS, JS, the case data
(a JSON script block) and the figures (base64 PNG) are all inlined, so the file opens from disk with no
network at all.
"""

from __future__ import annotations

from pathlib import Path

from .._io import atomic_write_text
from .._templates import environment
from .claims import case_claims
from .figures import render_figures
from .headline import headline_rows, seed_tables

#: The case keys the page's JavaScript reads (sampling lab, order trap, workload grid).
SCRIPT_DATA_KEYS = ("sampling", "cache_timing")


def render_report(case: dict, seed: dict | None = None, figures: dict[str, bytes] | None = None) -> str:
    """The report as one HTML string (figures rendered from ``case`` unless given)."""
    seed = seed_tables() if seed is None else seed
    figs = render_figures(case, seed) if figures is None else figures
    meta = case.get("meta", {})
    return (
        environment("genprobe.report")
        .get_template("report.html.j2")
        .render(
            case=case,
            seed=seed,
            figs=figs,
            meta=meta,
            seconds=meta.get("seconds", {}),
            headline=headline_rows(case, seed),
            findings=case_claims(case),
            data={k: case[k] for k in SCRIPT_DATA_KEYS if k in case},
        )
    )


def write_report(
    case: dict, out_dir: str | Path, seed: dict | None = None, figures: dict[str, bytes] | None = None
) -> Path:
    """Write ``report.html`` into ``out_dir`` atomically and return its path."""
    path = Path(out_dir) / "report.html"
    atomic_write_text(path, render_report(case, seed, figures))
    return path
