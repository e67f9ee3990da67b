"""Short HTML + PNG summary of a repair run: loop rate per ablated layer, α sweep, before/after."""

from __future__ import annotations

import base64
import html
import io
import os
from pathlib import Path

from .._io import atomic_write_bytes, atomic_write_text


def sweep_figure(report: dict) -> bytes:
    """PNG: (left) loop rate with each layer's direction ablated; (right) search loop rate and KL against α."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    loc = report["locate"]
    names = ["none"] + [f"L{r['layer']}" for r in loc["per_layer"]] + (["all"] if "all_layers" in loc else [])
    rates = [loc["base_loop_rate"]] + [r["loop_rate"] for r in loc["per_layer"]] + (
        [loc["all_layers"]["loop_rate"]] if "all_layers" in loc else [])
    ax1.bar(names, rates, color=["#888"] + ["#4a7"] * (len(names) - 1))
    ax1.set_ylabel("loop rate (locate set)")
    ax1.set_title("direction ablated from MLP output")
    s = report["search"]
    groups: dict[tuple, list[dict]] = {}
    for r in s["candidates"]:
        groups.setdefault((r["form"], tuple(r["layers"]), r["k"]), []).append(r)
    combos = sorted({(layers, k) for (_, layers, k) in groups})
    colours = {c: plt.cm.tab10(i % 10) for i, c in enumerate(combos)}  # colour = layers × k, style = form
    for (form, layers, k), rs in sorted(groups.items()):
        rs = sorted(rs, key=lambda r: r["alpha"])
        xs = [r["alpha"] for r in rs if r["loop_rate"] is not None]
        ys = [r["loop_rate"] for r in rs if r["loop_rate"] is not None]
        ls = "-" if form == "subtract" else "--"
        ax2.plot(xs, ys, ls, marker="o" if form == "subtract" else "s", ms=3, color=colours[(layers, k)],
                 label=f"{form} L{''.join(map(str, layers))} k={k}")
        over = [r["alpha"] for r in rs
                if r["kl"] is None or not (r["kl"] <= s["limits"]["max_kl"] and r["dloss"] <= s["limits"]["max_dloss"])]
        if over:
            ax2.plot(over, [0] * len(over), "x", color="red", ms=5)
    ax2.axhline(s["base_loop_rate"], color="#888", lw=1, label="no edit")
    if s.get("chosen"):
        ax2.plot([s["chosen"]["alpha"]], [s["chosen"]["loop_rate"]], "*", color="gold", ms=14, mec="k", label="chosen")
    ax2.set_xscale("log")
    ticks = sorted({r["alpha"] for r in s["candidates"]})
    ax2.set_xticks(ticks)
    ax2.set_xticklabels([f"{t:g}" for t in ticks])
    ax2.minorticks_off()
    ax2.set_xlabel("α (subtract: relative to the loop gap; project: fraction)")
    ax2.set_ylabel("estimated loop rate (search set)")
    ax2.set_title("strength sweep (red × = over KL/Δloss limit)")
    ax2.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def _pct(x) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def _ci(b: dict) -> str:
    lo, hi = b["loop_rate_ci95"]
    return f"{_pct(b['loop_rate'])} [{_pct(lo)}–{_pct(hi)}]"


def render_html(report: dict, png: bytes) -> str:
    """Self-contained HTML (figure inlined as base64)."""
    e = html.escape
    rows = []
    v = report.get("validation")
    if v:
        for name, key in (("all held-out prompts", ""), ("loop-prone subset", "loop_prone_")):
            b, a = v[f"{key}before"], v[f"{key}after"]
            rows.append(f"<tr><td>{name} (n={b['n']})</td><td>{_ci(b)}</td><td>{_ci(a)}</td>"
                        f"<td>{b['mean_distinct_2']:.3f} → {a['mean_distinct_2']:.3f}</td>"
                        f"<td>{b['mean_longest_repeat']:.2f} → {a['mean_longest_repeat']:.2f}</td></tr>")
        pg = v.get("plain_greedy")
        if pg and "after" in pg:
            b, a = pg["before"], pg["after"]
            rows.append(f"<tr><td>plain greedy, &lt;unk&gt; allowed (n={b['n']})</td><td>{_ci(b)}</td><td>{_ci(a)}</td>"
                        f"<td>{b['mean_distinct_2']:.3f} → {a['mean_distinct_2']:.3f}</td>"
                        f"<td>{b['mean_longest_repeat']:.2f} → {a['mean_longest_repeat']:.2f}</td></tr>")
        b, a = v["before"], v["after"]
        rows.append(f"<tr><td>short periods (≤4) / long</td><td>{_pct(b['short_loop_rate'])} / {_pct(b['long_loop_rate'])}</td>"
                    f"<td>{_pct(a['short_loop_rate'])} / {_pct(a['long_loop_rate'])}</td><td></td><td></td></tr>")
    samples = "".join(
        f"<tr><td>{e(x['prompt'])}</td><td>{e(x['before'])}<br><small>period {x['before_period']}</small></td>"
        f"<td>{e(x['after'])}<br><small>period {x['after_period']}</small></td></tr>"
        for x in (v or {}).get("samples", [])
    )
    patch = report.get("patch")
    reg = (v or {}).get("regression", {})
    edit = (
        f"<p>Chosen edit: <b>{e(str(patch['edit']))}</b>; weights changed {patch['weights_changed']:,} of "
        f"{patch['total_parameters']:,} ({100 * patch['fraction_changed']:.3f}%); KL {reg.get('kl', 0):.4f} nats, "
        f"Δloss {reg.get('dloss', 0):+.4f} nats.</p>" if patch else ""
    )
    img = base64.b64encode(png).decode()
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>genprobe loops repair</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}td,th{{border:1px solid #ccc;padding:4px 8px;vertical-align:top}}
table{{border-collapse:collapse;margin:1em 0}}</style></head><body>
<h1>Loop repair</h1><p>Verdict: <b>{e(report.get('verdict', ''))}</b>. Sampler: {e(str(report['sampler']))}.</p>
{edit}
<table><tr><th>held-out validation</th><th>loop rate before [95% CI]</th><th>after</th><th>distinct-2</th><th>longest repeat</th></tr>
{''.join(rows)}</table>
<img src="data:image/png;base64,{img}" style="max-width:100%">
<h2>Samples (loop-prone held-out prompts)</h2><table><tr><th>prompt</th><th>before</th><th>after</th></tr>{samples}</table>
<p>Search: {report['search']['admissible']} of {len(report['search']['candidates'])} candidates within the limits
(KL ≤ {report['search']['limits']['max_kl']}, Δloss ≤ {report['search']['limits']['max_dloss']}).
Timings (s): {e(str(report.get('timings_s', {})))}.</p></body></html>
"""


def write_summary(report: dict, out_dir: str | os.PathLike) -> dict[str, Path]:
    """Write ``repair.png`` and ``repair.html`` into ``out_dir`` atomically; returns their paths."""
    out = Path(out_dir)
    png = sweep_figure(report)
    atomic_write_bytes(out / "repair.png", png)
    atomic_write_text(out / "repair.html", render_html(report, png))
    return {"png": out / "repair.png", "html": out / "repair.html"}
