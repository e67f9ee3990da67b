"""The comparison as one table (Markdown, also printed), one figure (PNG) and one HTML page (Jinja2).

Everything here reads the typed :class:`~genprobe.loops.compare_fixes.CompareResult`; nothing is measured.
The page comes from ``templates/compare.html.j2`` rendered in the shared environment of
:mod:`genprobe._templates` (autoescaping on, strict undefined).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Sequence

from .._io import atomic_write_json, atomic_write_text, json_safe
from .._templates import DASH, pct
from .compare_fixes import CompareResult
from .compare_methods import CLASSES
from .repair_report import figure_png, write_page
from .scan import LoopRates


def _num(x: float | None, fmt: str = "{:.2f}") -> str:
    return DASH if x is None else fmt.format(x)


def _ci(rate: float, ci: list[float] | None) -> str:
    return f"{pct(rate)} [{100 * ci[0]:.1f}–{100 * ci[1]:.1f}]" if ci else pct(rate)


def _legit_cols(genre: str, ascii_only: bool = False) -> list[tuple[str, str]]:
    if genre == "tang":  # the figure's font has no CJK glyphs
        return [
            ("reduplication /100" if ascii_only else "疊字 /100", "reduplication_per100"),
            ("parallels /100", "parallel_per100"),
            ("stutter /100", "stutter_per100"),
        ]
    return [("repeated 4-grams", "repeated_ngram_rate")]


def _legit_cells(legit: Any, genre: str) -> list[str]:
    """The genre's legitimate-repetition cells of one row (dashes when there are no rates)."""
    return [
        _num(getattr(legit, k) if legit else None, "{:.2f}" if k.endswith("100") else "{:.3f}")
        for _, k in _legit_cols(genre)
    ]


LOOP_COLUMNS: tuple[tuple[str, Callable[[LoopRates], str]], ...] = (  # (header, cell): token-level loop measures
    ("degenerate [95% CI]", lambda s: _ci(s.degenerate_rate, s.degenerate_rate_ci95)),
    ("exact (short / long)", lambda s: f"{pct(s.loop_rate)} ({pct(s.short_loop_rate)} / {pct(s.long_loop_rate)})"),
    ("near", lambda s: pct(s.near_loop_rate)),
    ("repetitive tail", lambda s: pct(s.repetitive_rate)),
    ("distinct-2", lambda s: f"{s.mean_distinct_2:.3f}"),
    ("longest repeat", lambda s: f"{s.mean_longest_repeat:.1f}"),
    ("tail compr.", lambda s: f"{s.mean_tail_compression:.2f}"),
    ("seq-rep-4", lambda s: f"{s.mean_seq_rep_4:.3f}"),
)


def headers(result: CompareResult) -> list[str]:
    """Column names of the comparison table."""
    legit = [name for name, _ in _legit_cols(result.human.genre)]
    return ["method", *(h for h, _ in LOOP_COLUMNS), *legit, "NLL own", "NLL judge", "speed × greedy"]


def _row(name: str, rates: LoopRates | None, legit: Any, own: Any, judge: Any, speed: float | None, genre: str) -> list:
    nll = [_num(f.nll_per_char if f else None, "{:.3f}") for f in (own, judge)]
    loops = [cell(rates) if rates else DASH for _, cell in LOOP_COLUMNS]
    return [name, *loops, *_legit_cells(legit, genre), *nll, _num(speed, "{:.2f}×")]


def rows(result: CompareResult) -> list[list[str]]:
    """Every method's row (legit rates over all its generations), then the human texts' row (loop cells empty)."""
    g, h = result.human.genre, result.human
    return [
        _row(r.method.name, r.rates, r.legit, r.nll_own, r.nll_judge, r.cost.speed_vs_greedy, g) for r in result.methods
    ] + [_row(f"human (n = {h.n})", None, h.legit, h.nll_own, h.nll_judge, None, g)]


def _markdown(head: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    return "\n".join("| " + " | ".join(r) + " |" for r in [head, ["---"] * len(head), *body])


def markdown_table(result: CompareResult) -> str:
    """The comparison table in Markdown."""
    return _markdown(headers(result), rows(result))


def breaker_rows(result: CompareResult) -> list[list[str]]:
    """Per method: degenerate rate on the prompts of each baseline-loop class, and its own loops spanning a breaker."""
    out = []
    for r in result.methods:
        cells = [f"{pct(c.rate)} ({c.degenerate}/{c.n})" for c in r.breaker_classes]
        own = r.own_loops
        out.append([r.method.name, *cells, f"{own.spanning}/{own.loops} ({pct(own.spanning_share)})"])
    return out


def breaker_table(result: CompareResult) -> str:
    """The DRY / sequence-breaker table in Markdown."""
    hs = ["method", *[f"degenerate on '{c}' prompts" for c in CLASSES], "own loops whose unit spans a breaker"]
    return _markdown(hs, breaker_rows(result))


# ---- figure ---------------------------------------------------------------------------------
def figure(result: CompareResult) -> bytes:
    """PNG: degenerate rate per method (CI bars, exact rate dots); degenerate vs judge NLL; legit repetition."""

    def panels(axes: Any) -> None:
        _rates_panel(axes[0], result)
        _nll_panel(axes[1], result)
        _legit_panel(axes[2], result)

    return figure_png(panels, 3, (16, 4.8), 100)


def _rates_panel(ax: Any, result: CompareResult) -> None:
    names = [r.method.name for r in result.methods]
    deg = [r.rates.degenerate_rate for r in result.methods]
    lo = [d - r.rates.degenerate_rate_ci95[0] for d, r in zip(deg, result.methods, strict=True)]
    hi = [r.rates.degenerate_rate_ci95[1] - d for d, r in zip(deg, result.methods, strict=True)]
    xs = range(len(names))
    colours = ["#c55" if r.method.patched else "#4a7" for r in result.methods]
    ax.bar(xs, deg, yerr=[lo, hi], color=colours, capsize=2, label="degenerate (95% CI)")
    ax.plot(xs, [r.rates.loop_rate for r in result.methods], "k.", label="exact loop")
    ax.set_xticks(list(xs), names, rotation=60, ha="right", fontsize=8)
    ax.set(ylabel="share of generations", title="loops (red: weight edit)")
    ax.legend(fontsize=7)


def _nll_panel(ax: Any, result: CompareResult) -> None:
    use_judge = result.judge is not None
    for r in result.methods:
        f = r.nll_judge if use_judge else r.nll_own
        if f is not None and f.nll_per_char is not None:
            ax.plot(f.nll_per_char, r.rates.degenerate_rate, "o", color="#c55" if r.method.patched else "#4a7")
            ax.annotate(r.method.name, (f.nll_per_char, r.rates.degenerate_rate), fontsize=7)
    h = result.human.nll_judge if use_judge else result.human.nll_own
    if h is not None and h.nll_per_char is not None:
        ax.axvline(h.nll_per_char, color="#888", lw=1, ls="--", label="human texts")
        ax.legend(fontsize=7)
    ax.set(xlabel=f"NLL per character under the {'judge' if use_judge else 'model itself'} (nats)")
    ax.set(ylabel="degenerate rate", title="loops vs fluency")


def _legit_panel(ax: Any, result: CompareResult) -> None:
    cols = _legit_cols(result.human.genre, ascii_only=True)[:2]
    names = [r.method.name for r in result.methods]
    width = 0.8 / len(cols)
    for j, (label, key) in enumerate(cols):
        vals = [getattr(r.legit, key) or 0.0 for r in result.methods]
        ax.bar([i + j * width for i in range(len(names))], vals, width, label=label)
        h = getattr(result.human.legit, key) if result.human.legit else None
        if h is not None:
            ax.axhline(h, color=f"C{j}", lw=1, ls="--", label=f"{label}, human")
    ax.set_xticks(
        [i + width * (len(cols) - 1) / 2 for i in range(len(names))], names, rotation=60, ha="right", fontsize=8
    )
    ax.set_title("legitimate repetition kept (dashed: human)")
    ax.legend(fontsize=7)


# ---- HTML and files -------------------------------------------------------------------------
def write_outputs(result: CompareResult, out_dir: str | os.PathLike) -> dict[str, Path]:
    """Write compare.json, compare-texts.json, compare.md, compare.png and compare.html atomically."""
    out = Path(out_dir)
    files = {"json": out / "compare.json", "texts": out / "compare-texts.json", "table": out / "compare.md"}
    atomic_write_json(files["json"], json_safe(result))
    atomic_write_json(files["texts"], result.texts_dict(), indent=None)
    atomic_write_text(files["table"], markdown_table(result) + "\n\n" + breaker_table(result) + "\n")
    return files | write_page(
        out,
        "compare",
        figure(result),
        "compare.html.j2",
        r=result,
        headers=headers(result),
        rows=rows(result),
        classes=CLASSES,
        breaker_rows=breaker_rows(result),
        sample_prompts=[result.prompts[i] for i in result.sample_prompts],
        pct=pct,
        num=_num,
    )
