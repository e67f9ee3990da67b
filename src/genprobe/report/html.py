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
from .headline import headline_rows

#: The case keys the page's JavaScript reads (sampling lab, order trap, workload grid).
SCRIPT_DATA_KEYS = ("sampling", "cache_timing")


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
            data={k: case[k] for k in SCRIPT_DATA_KEYS if k in case},
        )
    )


def write_report(case: dict, out_dir: Path, seed: dict, figures: dict[str, bytes]) -> Path:
    """Write ``report.html`` into ``out_dir`` atomically and return its path."""
    atomic_write_text(out_dir / "report.html", render_report(case, seed, figures))
    return out_dir / "report.html"
