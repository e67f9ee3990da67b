"""The loop pages, from typed results or their JSON (nothing here is measured): ``loops repair``'s patch,
``repair.json`` and HTML + PNG summary (:func:`write_repair`), ``loops compare``'s table, figure and HTML page
(:func:`write_outputs`); Jinja2 templates under ``templates/`` rendered in :mod:`genprobe._templates`' environment.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Sequence

from .._io import atomic_write_bytes, atomic_write_json, atomic_write_text, figure_bytes, json_safe
from .._templates import DASH, environment, pct
from .compare_fixes import CLASSES, CompareResult
from .patch import Patch, save_patch
from .scan import LoopRates

ROWS = (  # (label, key of a LoopRates dict, format): the rates with their 95% CIs, then the means
    ("exact loop rate (periodic tail)", "loop_rate", "ci"),
    ("near-loop rate (≥ 80% of the tail repeats p back)", "near_loop_rate", "ci"),
    ("exact or near loop", "any_loop_rate", "ci"),
    ("repetitive tail (≥ 2.5 tail tokens per LZ piece)", "repetitive_rate", "ci"),
    ("degenerate: any of the three (what the search lowers)", "degenerate_rate", "ci"),
    ("short (period ≤ 4) exact loops", "short_loop_rate", "pct"),
    ("long exact loops", "long_loop_rate", "pct"),
    ("short / long, exact or near", None, "short_long_any"),
    ("mean distinct-2", "mean_distinct_2", "{:.3f}"),
    ("mean longest repeat ({unit}s)", "mean_longest_repeat", "{:.2f}"),
    ("mean tail compression ({unit}s per LZ piece)", "mean_tail_compression", "{:.2f}"),
    ("mean seq-rep-4", "mean_seq_rep_4", "{:.3f}"),
)


def figure_png(
    panels: Sequence[Callable[[Any, Any], None]], data: Any, figsize: tuple[float, float], dpi: int
) -> bytes:
    """PNG of one row of panels, each drawn by ``panel(ax, data)`` (matplotlib, Agg: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=figsize, squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        panel(ax, data)
    fig.tight_layout()
    return figure_bytes(fig, dpi=dpi)


def _locate_panel(ax: Any, report: dict) -> None:
    loc = report["locate"]
    rows = [("none", loc["base_degenerate_rate"], loc["base_loop_rate"])]
    rows += [(f"L{r['layer']}", r["degenerate_rate"], r["loop_rate"]) for r in loc["per_layer"]]
    if loc.get("all_layers"):
        rows.append(("all", loc["all_layers"]["degenerate_rate"], loc["all_layers"]["loop_rate"]))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r[1] for r in rows], 0.4, color="#4a7", label="degenerate")
    ax.bar([x + 0.2 for x in xs], [r[2] for r in rows], 0.4, color="#bbb", label="exact only")
    ax.set_xticks(list(xs), [r[0] for r in rows])
    ax.set(ylabel="loop rate (locate set)", title="direction ablated from MLP output")
    ax.legend(fontsize=7)


def _rank_panel(ax: Any, report: dict) -> None:
    scores = sorted((report["search"]["scaled"] or {}).get("layer_scores", []), key=lambda r: r["layer"])
    ax.bar([r["layer"] for r in scores], [r["dlogp"] for r in scores], color="#4a7")
    ax.set(
        xlabel="layer", ylabel="Δ log p(loop token), nats", title="direction ablated: loop pressure (teacher-forced)"
    )


def _sweep_panel(ax: Any, report: dict) -> None:
    import matplotlib.pyplot as plt

    s = report["search"]
    groups: dict[tuple, list[dict]] = {}
    for r in s["candidates"]:
        groups.setdefault((r["form"], tuple(r["layers"]), r["k"]), []).append(r)
    combos = sorted({(layers, k) for (_, layers, k) in groups})
    colours = {c: plt.cm.tab10(i % 10) for i, c in enumerate(combos)}  # colour = layers × k, style = form
    lim = s["limits"]
    for (form, layers, k), rs in sorted(groups.items()):
        rs = sorted(rs, key=lambda r: r["alpha"])
        pts = [(r["alpha"], r["degenerate_rate"]) for r in rs if r["degenerate_rate"] is not None]
        ax.plot(
            [p[0] for p in pts],
            [p[1] for p in pts],
            "-" if form == "subtract" else "--",
            marker="o" if form == "subtract" else "s",
            ms=3,
            color=colours[(layers, k)],
            label=f"{form} L{''.join(map(str, layers))} k={k}",
        )
        over = [r["alpha"] for r in rs if r["kl"] is None or r["kl"] > lim["max_kl"] or r["dloss"] > lim["max_dloss"]]
        if over:
            ax.plot(over, [0] * len(over), "x", color="red", ms=5)
    ax.axhline(s["base_loop_rate"], color="#888", lw=1, label="no edit")
    if s.get("chosen"):
        c = s["chosen"]
        ax.plot([c["alpha"]], [c["degenerate_rate"]], "*", color="gold", ms=14, mec="k", label="chosen")
    ticks = sorted({r["alpha"] for r in s["candidates"]})
    if ticks:
        ax.set_xscale("log")
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.minorticks_off()
    ax.set(xlabel="α (subtract: relative to the loop gap; project: fraction)")
    ax.set(ylabel="estimated degenerate rate (search set)", title="strength sweep (red × = over KL/Δloss limit)")
    ax.legend(fontsize=6, ncol=2)


# ---- repair HTML ----------------------------------------------------------------------------
def _cell(b: dict, key: str | None, fmt: str) -> str:
    if fmt == "ci":
        lo, hi = b[f"{key}_ci95"]
        return f"{pct(b[key])} [{pct(lo)}–{pct(hi)}]"
    if fmt == "short_long_any":
        return f"{pct(b['short_any_rate'])} / {pct(b['long_any_rate'])}"
    return pct(b[key]) if fmt == "pct" else fmt.format(b[key])


def rate_rows(before: dict, after: dict, unit: str = "token") -> list[dict]:
    """Rows of (label, before, after) for one pair of LoopRates dicts: rates with CIs, then means."""
    return [
        {
            "label": label.format(unit=unit),
            "before": _cell(before, key, fmt),
            "after": _cell(after, key, fmt),
            "strong": key == "degenerate_rate",
        }
        for label, key, fmt in ROWS
    ]


def write_page(out_dir: str | os.PathLike, stem: str, png: bytes, template: str, **context: Any) -> dict[str, Path]:
    """Write ``<stem>.png`` and ``<stem>.html`` (``template`` rendered with the figure inlined) atomically."""
    out = Path(out_dir)
    html = environment("genprobe.loops").get_template(template).render(image=png, **context)
    atomic_write_bytes(out / f"{stem}.png", png)
    atomic_write_text(out / f"{stem}.html", html)
    return {"png": out / f"{stem}.png", "html": out / f"{stem}.html"}


def write_summary(report: dict, out_dir: str | os.PathLike) -> dict[str, Path]:
    """Write ``repair.png`` (layer ablations or the scaled search's layer ranking; the strength sweep) and
    ``repair.html`` into ``out_dir`` atomically; returns their paths."""
    v, tables = report.get("validation"), []
    if v:  # (title, before, after, unit): the held-out set, its character view, its loop-prone part, plain greedy
        b, a, prone = v["before"], v["after"], v["loop_prone_before"]
        pb, pa = (v.get("plain_greedy") or {}).get("before"), (v.get("plain_greedy") or {}).get("after")
        tables = [
            (f"all held-out prompts (n = {b['n']}), tokens", b, a, "token"),
            ("the same generations measured on characters", b.get("chars"), a.get("chars"), "character"),
            (f"loop-prone held-out prompts (n = {prone['n']})", prone, v["loop_prone_after"], "token"),
            (f"plain greedy, <unk> allowed (n = {(pb or {}).get('n')})", pb, pa, "token"),
        ]
    rows = [{"title": t, "rows": rate_rows(x, y, unit)} for t, x, y, unit in tables if x and y]
    png = figure_png([_locate_panel if report.get("locate") else _rank_panel, _sweep_panel], report, (11, 4), 110)
    return write_page(out_dir, "repair", png, "repair.html.j2", report=report, tables=rows)


def write_repair(out_dir: str | os.PathLike, report: Any, patch: Patch | None, **extra: Any) -> dict:
    """Write the patch (when one passed), ``repair.html``, ``repair.png`` and ``repair.json`` into ``out_dir``;
    returns what ``repair.json`` holds (the report's JSON, ``extra`` and the files written)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = json_safe(report) | json_safe(extra)
    files: dict[str, str] = {}
    if patch is not None:
        st, js = save_patch(patch, out / "patch")
        files.update(patch_tensors=str(st), patch=str(js))
    files.update({k: str(v) for k, v in write_summary(data, out).items()})
    atomic_write_json(out / "repair.json", data | {"files": files})
    return data | {"files": files}


# ---- loops compare --------------------------------------------------------------------------
def _num(x: float | None, fmt: str = "{:.2f}") -> str:
    return DASH if x is None else fmt.format(x)


def _legit_cols(genre: str, ascii_only: bool = False) -> list[tuple[str, str]]:
    if genre == "tang":  # the figure's font has no CJK glyphs
        return [
            ("reduplication /100" if ascii_only else "疊字 /100", "reduplication_per100"),
            ("parallels /100", "parallel_per100"),
            ("stutter /100", "stutter_per100"),
        ]
    return [("repeated 4-grams", "repeated_ngram_rate")]


LOOP_COLUMNS: tuple[tuple[str, Callable[[LoopRates], str]], ...] = (  # (header, cell): token-level loop measures
    ("degenerate [95% CI]", lambda s: f"{pct(s.degenerate_rate)} [{'–'.join(map(pct, s.degenerate_rate_ci95))}]"),
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
    kept = [
        _num(getattr(legit, k) if legit else None, "{:.2f}" if k.endswith("100") else "{:.3f}")
        for _, k in _legit_cols(genre)
    ]
    return [name, *loops, *kept, *nll, _num(speed, "{:.2f}×")]


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


# ---- compare figure: degenerate rate per method (CI bars, exact dots), degenerate vs NLL, legit repetition
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


# ---- compare HTML and files -----------------------------------------------------------------
def write_outputs(result: CompareResult, out_dir: str | os.PathLike) -> dict[str, Path]:
    """Write compare.json, compare-texts.json, compare.md, compare.png and compare.html atomically."""
    out = Path(out_dir)
    files = {"json": out / "compare.json", "texts": out / "compare-texts.json", "table": out / "compare.md"}
    atomic_write_json(files["json"], json_safe(result))
    texts = {m.method.name: m.texts for m in result.methods}  # every prompt with every method's text, for audit
    atomic_write_json(files["texts"], {"prompts": result.prompts, "texts": texts}, indent=None)
    atomic_write_text(files["table"], markdown_table(result) + "\n\n" + breaker_table(result) + "\n")
    return files | write_page(
        out,
        "compare",
        figure_png([_rates_panel, _nll_panel, _legit_panel], result, (16, 4.8), 100),
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
