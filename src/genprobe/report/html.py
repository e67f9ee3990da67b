"""One self-contained, offline ``report.html``: our numbers beside the seed's, figures, interactive pages.

Everything is inline — CSS, JS, the case data (as a JSON script block) and the figures (base64
PNG) — so the file opens from disk with no network at all.
"""

from __future__ import annotations

import base64
import html
import json
from importlib import resources
from pathlib import Path
from typing import Any

from .._io import atomic_write_text
from ..experiments.seed import seed_tables
from .figures import render_figures


def _asset(name: str) -> str:
    return (resources.files("genprobe.report") / "assets" / name).read_text(encoding="utf-8")


def esc(x: Any) -> str:
    """HTML-escape anything (None → en dash)."""
    return "–" if x is None else html.escape(str(x))


def num(x: Any, nd: int = 3) -> str:
    """Format a number for a table cell."""
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if x != 0 and (abs(x) < 10 ** -nd or abs(x) >= 1e6):
            return f"{x:.2e}"
        return f"{x:.{nd}f}"
    return esc(x)


def pct(x: Any) -> str:
    """A share as a percentage."""
    return "–" if x is None else f"{100 * x:.1f}%"


def table(head: list[str], rows: list[list[str]], cls: list[str] | None = None, row_cls: list[str] | None = None,
          id: str | None = None) -> str:
    """An HTML table from pre-formatted cells (cells are trusted HTML; escape before)."""
    cls = cls or [""] * len(head)
    h = "".join(f'<th class="{c}">{x}</th>' for x, c in zip(head, cls))
    body = []
    for i, r in enumerate(rows):
        rc = f' class="{row_cls[i]}"' if row_cls and row_cls[i] else ""
        body.append(f"<tr{rc}>" + "".join(f'<td class="{c}">{x}</td>' for x, c in zip(r, cls)) + "</tr>")
    ident = f' id="{id}"' if id else ""
    return f"<table{ident}><thead><tr>{h}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def unk_html(text: str) -> str:
    """Escape a decoded text and make ``<unk>`` markers visible but quiet."""
    return esc(text).replace("&lt;unk&gt;", '<span class="unk">&lt;unk&gt;</span>')


def _fig(figs: dict[str, bytes], name: str, caption: str) -> str:
    if name not in figs:
        return ""
    b64 = base64.b64encode(figs[name]).decode("ascii")
    return (f'<figure><img alt="{esc(caption)}" src="data:image/png;base64,{b64}">'
            f"<figcaption>{esc(caption)}</figcaption></figure>")


# ---------------------------------------------------------------------------------- sections
def headline_rows(case: dict, seed: dict) -> list[tuple[str, Any, Any, str]]:
    """(label, ours, seed, kind) rows of the headline table (also used by the CLI and README)."""
    rows: list[tuple[str, Any, Any, str]] = []
    m, sm = case.get("model", {}), seed.get("model", {})
    rows += [("parameters", m.get("params"), sm.get("params"), "int"),
             ("validation loss (nats)", m.get("val_loss"), sm.get("val_loss"), "f3"),
             ("unigram baseline CE (nats)", m.get("unigram_ce"), sm.get("unigram_ce"), "f3"),
             ("vocabulary coverage (1,200 chars)", m.get("coverage_1200"), sm.get("coverage_1200"), "pct"),
             ("<unk> share of corpus positions", m.get("unk_share"), sm.get("unk_share_claimed"), "pct")]
    d = case.get("decoding")
    if d:
        sd = {r["strategy"]: r for r in seed.get("decoding", {}).get("rows", [])}
        g, b = d["rows"][0], d["rows"][1]
        samp = [r for r in d["rows"] if not r["sampler"]["greedy"]]
        rows += [("greedy distinct-2", g["distinct_2"], sd.get("greedy", {}).get("distinct_2"), "f3"),
                 ("greedy <unk> share", g["unk_share"], sd.get("greedy", {}).get("unk_share"), "pct"),
                 ("greedy + ban <unk> distinct-2", b["distinct_2"], sd.get("greedy + ban <unk>", {}).get("distinct_2"), "f3"),
                 ("lowest distinct-2 among sampling strategies", min(r["distinct_2"] for r in samp),
                  min((r["distinct_2"] for r in seed.get("decoding", {}).get("rows", [])[2:]), default=None), "f3")]
    s = case.get("sampling")
    if s:
        e1 = next((r for r in s["entropy_vs_temperature"] if r["tau"] == 1.0), {})
        se1 = next((r for r in seed.get("sampling", {}).get("entropy_vs_temperature", []) if r["tau"] == 1.0), {})
        n9 = next((r for r in s["nucleus_curve_tau_1"] if r["p"] == 0.9), {})
        sn9 = next((r for r in seed.get("sampling", {}).get("nucleus_curve_tau_1", []) if r["p"] == 0.9), {})
        t2 = next((r for r in s["order_trap_top_p_0_9"] if r["tau"] == 2.0), {})
        st2 = next((r for r in seed.get("sampling", {}).get("order_trap_top_p_0_9", []) if r["tau"] == 2.0), {})
        rows += [("entropy after the prompt at τ = 1 (nats)", e1.get("entropy"), se1.get("entropy"), "f3"),
                 ("top-p 0.9 kept set at τ = 1", n9.get("kept"), sn9.get("kept"), "int"),
                 ("order trap τ = 2: trunc→temp / temp→trunc", f"{t2.get('trunc_then_temp')} / {t2.get('temp_then_trunc')}",
                  f"{st2.get('trunc_then_temp')} / {st2.get('temp_then_trunc')}", "str")]
    e = case.get("exposure")
    if e:
        se = seed.get("exposure", {})
        rows += [("teacher forcing on 已驚飛。方從列子御: mean loss", e["teacher_forcing_mean_loss"],
                  se.get("teacher_forcing_mean_loss"), "f3")]
    c = case.get("cache_exact")
    if c:
        sc = seed.get("cache_exact", {})
        rows += [("KV cache prefill max |Δlogit|", c["prefill_max_abs_dlogit"], sc.get("prefill_max_abs_dlogit"), "e"),
                 ("KV cache incremental max |Δlogit|", c["incremental_max_abs_dlogit"], sc.get("incremental_max_abs_dlogit"), "e")]
    t = case.get("cache_timing")
    if t and t.get("rows"):
        st = seed.get("cache_timing", {})
        cpu1 = next((r for r in st.get("rows", []) if r["device"] == "cpu" and r["batch"] == 1), {})
        rows += [("token forwards naive / cached (P=7, N=50)",
                  f"{t['token_forwards']['naive_counted']:,} / {t['token_forwards']['cached_counted']:,}",
                  f"{seed.get('token_forwards', {}).get('naive_counted', '–'):,} / {seed.get('token_forwards', {}).get('cached_counted', '–'):,}", "str"),
                 ("CPU wall-clock speed-up, batch 1", t["rows"][0]["speedup"], cpu1.get("speedup"), "f2")]
    return rows


def _fmt(x: Any, kind: str) -> str:
    if x is None:
        return "–"
    if kind == "pct":
        return pct(x)
    if kind == "f3":
        return num(float(x), 3)
    if kind == "f2":
        return num(float(x), 2)
    if kind == "e":
        return "0.0" if x == 0 else f"{x:.2e}"
    if kind == "int":
        return num(int(x))
    return esc(x)


def _headline(case: dict, seed: dict) -> str:
    rows = [[esc(lbl), _fmt(o, k), _fmt(s, k)] for lbl, o, s, k in headline_rows(case, seed)]
    return table(["", "ours", "seed"], rows, ["", "num", "num seed"], id="headline")


def _findings(case: dict) -> str:
    from ..experiments.findings import findings

    rows = [[f'<span class="{"ok" if f["holds"] else "warn"}">{"holds" if f["holds"] else "does NOT hold"}</span>',
             esc(f["claim"]), esc(f["evidence"])] for f in findings(case)]
    if not rows:
        return ""
    return ("<h3>The chapter's findings, checked on our model</h3>"
            + table(["", "finding", "our numbers"], rows, id="findings"))


def _decoding(case: dict, seed: dict, figs: dict) -> str:
    d = case["decoding"]
    sd = {r["strategy"]: r for r in seed.get("decoding", {}).get("rows", [])}
    rows, rc = [], []
    for r in d["rows"]:
        s = sd.get(r["strategy"], {})
        lr = r["longest_repeat"]
        rows.append([esc(r["strategy"]),
                     f'{num(r["distinct_1"])} <span class="seed">/ {num(s.get("distinct_1"))}</span>',
                     f'{num(r["distinct_2"])} <span class="seed">/ {num(s.get("distinct_2"))}</span>',
                     f'{num(r["distinct_3"])} <span class="seed">/ {num(s.get("distinct_3"))}</span>',
                     f'{lr}-gram' if lr and lr > 1 else "none",
                     "none" if not s.get("longest_repeat") else f'{s["longest_repeat"]}-gram',
                     pct(r["unk_share"]),
                     esc(f'period {r["loop_period"]}') if r["looping"] else "no"])
        rc.append("bad" if r["sampler"]["greedy"] else "good")
    out = [f'<h2 id="decoding">1 · Seven decoding strategies (seed §3.1.2–3.1.3)</h2>',
           f'<p class="sub">Prompt <span class="poem">{esc(d["prompt"])}</span>, {d["new_tokens"]} new tokens, fixed seed. '
           f'Cells: ours / <span class="seed">seed</span>. Metrics are on the generated tokens with <code>&lt;unk&gt;</code> '
           f'counted as a token.</p>']
    if d.get("prompt_unknown_chars"):
        out.append(f'<div class="note">The prompt contains character(s) outside the 1,200-character vocabulary '
                   f'(<span class="poem">{esc("".join(d["prompt_unknown_chars"]))}</span>): the corpus is traditional Chinese, '
                   f'the prompt simplified — the seed\'s own pitfall. They are fed as <code>&lt;unk&gt;</code>.</div>')
    out.append(table(["strategy", "distinct-1", "distinct-2", "distinct-3", "longest repeat", "seed", "&lt;unk&gt;", "exact loop"],
                     rows, ["", "num", "num", "num", "num", "num seed", "num", ""], rc, id="decoding-table"))
    if d.get("sampling_bans_unk"):
        w = d.get("rows_sampling_with_unk", [])
        out.append('<div class="note">The seed\'s table shows 0% <code>&lt;unk&gt;</code> for every sampling strategy, which '
                   'cannot happen by chance at this <code>&lt;unk&gt;</code> rate, so the sampling rows ban <code>&lt;unk&gt;</code> '
                   'as the seed evidently did. Without the ban, distinct-2 is: '
                   + ", ".join(f'{esc(r["strategy"])} {num(r["distinct_2"])} ({pct(r["unk_share"])} &lt;unk&gt;)' for r in w)
                   + ".</div>")
    out.append(_fig(figs, "fig_decoding_distinct2.png", "Fig. 3.1 — distinct-2 per strategy (red: deterministic, green: sampled; grey: seed)."))
    texts = [[esc(r["strategy"]), f'<span class="poem">{unk_html(r["text_with_unk"])}</span>'] for r in d["rows"]]
    out.append("<h3>The texts (with <code>&lt;unk&gt;</code> shown)</h3>" + table(["strategy", "prompt + 50 tokens"], texts))
    if d.get("other_prompts"):
        seed_units = seed.get("decoding", {}).get("other_prompts_loop_units", {})
        rows = []
        for o in d["other_prompts"]:
            g, b = o["greedy"], o["greedy_ban_unk"]
            rows.append([f'<span class="poem">{esc(o["prompt"])}</span>',
                         f'<span class="poem">{unk_html(g["loop_unit"] or "–")}</span> (d2 {num(g["distinct_2"])})',
                         f'<span class="poem">{esc(b["loop_unit"] or "no exact loop")}</span>; most repeated: '
                         f'<span class="poem">{esc(b["longest_repeat_text"])}</span> (d2 {num(b["distinct_2"])})',
                         f'<span class="poem">{esc(seed_units.get(o["prompt"], "–"))}</span>'])
        out.append("<h3>Other prompts, greedy (seed §3.1.4)</h3>"
                   + table(["prompt", "greedy loop unit", "greedy + ban &lt;unk&gt;", "seed's unit"], rows, ["", "", "", "seed"], id="other-prompts"))
        out.append("<p>Ban-<code>&lt;unk&gt;</code> texts: " + "<br>".join(
            f'<span class="poem">{esc(o["greedy_ban_unk"]["text"])}</span>' for o in d["other_prompts"]) + "</p>")
    tf = d.get("teacher_forcing")
    if tf:
        out.append(f'<p>Suspect one, "the model is not trained": teacher-forcing loss on real validation text '
                   f'<b>{num(tf["val_loss"])}</b> vs the unigram baseline <b>{num(tf["unigram_ce"])}</b> '
                   f'(seed: {num(seed.get("model", {}).get("teacher_forcing_loss_on_real_poems"))} vs {num(seed.get("model", {}).get("unigram_ce"))}).</p>')
    return "\n".join(out)


def _sampling(case: dict, seed: dict, figs: dict) -> str:
    s = case["sampling"]
    ss = seed.get("sampling", {})
    se = {r["tau"]: r for r in ss.get("entropy_vs_temperature", [])}
    rows = [[num(r["tau"], 1), num(r["entropy"]), f'<span class="seed">{num(se.get(r["tau"], {}).get("entropy"))}</span>',
             num(r["perplexity"], 1), f'<span class="seed">{num(se.get(r["tau"], {}).get("perplexity"), 1)}</span>',
             num(r["max_prob"], 4), f'<span class="seed">{num(se.get(r["tau"], {}).get("max_prob"), 4)}</span>']
            for r in s["entropy_vs_temperature"]]
    sn = {r["p"]: r["kept"] for r in ss.get("nucleus_curve_tau_1", [])}
    nrows = [[num(r["p"], 3), num(r["kept"]), f'<span class="seed">{num(sn.get(r["p"]))}</span>', pct(r["share_of_vocab"])]
             for r in s["nucleus_curve_tau_1"]]
    so = {r["tau"]: r for r in ss.get("order_trap_top_p_0_9", [])}
    orders = [k for k in s["order_trap_top_p_0_9"][0] if k != "tau"]
    orows = [[num(r["tau"], 1)] + [num(r[o]) for o in orders]
             + [f'<span class="seed">{num(so.get(r["tau"], {}).get("trunc_then_temp"))} / {num(so.get(r["tau"], {}).get("temp_then_trunc"))}</span>']
             for r in s["order_trap_top_p_0_9"]]
    top = " ".join(f'<span class="chip"><b>{esc(t["token"])}</b> {100 * t["prob"]:.1f}%</span>' for t in s.get("top10", []))
    return "\n".join([
        '<h2 id="sampling">2 · The sampling math on the real distribution (seed §3.5)</h2>',
        f'<p class="sub">The next-token distribution after <span class="poem">{esc(s["prompt"])}</span> '
        f'({s["vocab_size"]:,} tokens; ln V = {num(s["log_vocab"])}). Most likely: {top}</p>',
        "<h3>Entropy, perplexity and max probability against τ</h3>",
        table(["τ", "entropy", "seed", "perplexity", "seed", "max prob", "seed"], rows,
              ["num"] * 7, id="entropy-table"),
        _fig(figs, "fig_entropy_temperature.png", "Fig. 3.5 — entropy (left) and max probability (right) against τ; dashed: seed."),
        "<h3>Nucleus curve (τ = 1): tokens kept by top-p</h3>",
        table(["p", "kept", "seed", "share of vocab"], nrows, ["num"] * 4, id="nucleus-table"),
        "<h3>The order trap at top-p 0.9: kept-set size</h3>",
        table(["τ"] + [esc(o) for o in orders] + ["seed A / B"], orows, ["num"] * (len(orders) + 2), id="order-table"),
        '<p>Presets: <code>hf</code> = temperature → top-k → top-p (transformers\' warpers), <code>vllm</code> = '
        'temperature → min-p → top-k → top-p, <code>llama.cpp</code> = top-k → top-p → min-p → temperature.</p>',
    ])


def _lab() -> str:
    return """
<h2 id="lab-h">Experiment 3-1 · Sampling lab (seed §3.8.1)</h2>
<p class="sub">Every bar is one token of the real distribution above, sorted by probability. Truncated tokens turn grey;
the read-outs are those of the distribution you would actually sample from.</p>
<div class="card" id="lab">
  <div class="controls">
    <label>temperature τ <output id="lab-tau-val"></output><input id="lab-tau" type="range" min="0.1" max="3" step="0.05" value="1"></label>
    <label>top-k (0 = off) <output id="lab-topk-val"></output><input id="lab-topk" type="range" min="0" max="1202" step="1" value="0"></label>
    <label>top-p (1 = off) <output id="lab-topp-val"></output><input id="lab-topp" type="range" min="0.05" max="1" step="0.01" value="1"></label>
    <label>order <select id="lab-order"><option value="trunc_then_temp">truncate, then temperature (seed default)</option>
      <option value="temp_then_trunc">temperature, then truncate (HF)</option></select>
      <span style="display:block;margin-top:6px"><input id="lab-log" type="checkbox" checked> log scale</span></label>
  </div>
  <div class="readout">
    <div>kept set<b id="lab-kept"></b></div><div>entropy<b id="lab-entropy"></b></div>
    <div>perplexity<b id="lab-ppl"></b></div><div>max probability<b id="lab-maxp"></b></div>
  </div>
  <canvas id="lab-canvas" width="1000" height="220"></canvas>
  <div class="legend" style="font-size:12px;color:#5b6570;margin-top:4px"><span style="background:#00838f;margin-left:0"></span>kept
    <span style="background:#cfd8dc"></span>truncated (shown at its τ = 1 probability) <span style="background:#ef6c00"></span>last draw</div>
  <p style="margin:10px 0 4px"><button id="lab-draw">Draw a character</button> <button id="lab-reset" class="secondary">Reset</button>
    &nbsp; <span id="lab-sample" data-value=""></span></p>
  <div>Draws so far: <span id="lab-history" class="poem"></span></div>
  <div style="margin-top:8px">Candidates still alive: <span id="lab-top"></span></div>
</div>
<p>Try it: at τ = 1, pull top-p from 1.0 down to 0.5 and watch the kept set collapse; fix top-p = 0.9 and move τ —
under "truncate, then temperature" the kept set does not move.</p>"""


def _trap(case: dict) -> str:
    return """
<h2 id="trap-h">Experiment 3-2 · The order trap (seed §3.8.2)</h2>
<div class="card" id="trap">
  <div class="controls">
    <label>temperature τ <output id="trap-tau-val"></output><input id="trap-tau" type="range" min="0.25" max="3" step="0.05" value="1"></label>
    <label>top-p <output id="trap-p-val"></output><input id="trap-p" type="range" min="0.5" max="0.999" step="0.001" value="0.9"></label>
  </div>
  <div class="readout">
    <div>A · truncate, then temperature<b id="trap-a" style="color:#00838f"></b></div>
    <div>B · temperature, then truncate<b id="trap-b" style="color:#ef6c00"></b></div>
    <div>ratio<b id="trap-ratio"></b></div>
  </div>
  <canvas id="trap-canvas" width="1000" height="190"></canvas>
  <div class="legend" style="font-size:12px;color:#5b6570;margin-top:4px"><span style="background:#00838f;margin-left:0"></span>A (flat: τ never moves the cut)
    <span style="background:#ef6c00"></span>B (the cut slides with τ) — kept-set size against τ at the current p</div>
</div>"""


def _exposure(case: dict, seed: dict, figs: dict) -> str:
    e = case["exposure"]
    se = seed.get("exposure", {})
    srows = {r["pos"]: r for r in se.get("teacher_forcing_rows", [])}
    rows = []
    for r in e["teacher_forcing_rows"]:
        top = " ".join(f'<span class="poem">{unk_html(t["token"])}</span> {t["prob"]:.3f}' for t in r["top3"])
        s = srows.get(r["pos"], {})
        rows.append([str(r["pos"]), f'<span class="poem">{unk_html(r["context"])}</span>', f'<span class="poem">{unk_html(r["truth"])}</span>',
                     num(r["loss"]), f'<span class="seed">{num(s.get("loss"))} ({unk_html(s.get("truth", ""))})</span>', top])
    sp = {r["k"]: r for r in se.get("perturbation", [])}
    prow = []
    for p in e["perturbation"]:
        s = sp.get(p["k"], {})
        prow.append([str(p["k"]), f'<span class="poem">{unk_html(p["truth"])}</span>', f'<span class="poem">{unk_html(p["model_wanted"])}</span>'
                     + (" (runner-up)" if p.get("argmax_was_truth") else ""),
                     f'{p["next_dloss"]:+.3f}', f'{p["peak"]:+.3f}', f'{p["tail_mean"]:+.3f}', esc(p["half_life_steps"]),
                     f'<span class="seed">{s.get("next_dloss", "–")}, {s.get("peak", "–")}, {s.get("tail_mean", "–")}, {s.get("half_life_steps", "–")}</span>'])
    cr, cf, cg = e["confidence_real_text"], e["confidence_free_generation"], e.get("confidence_free_generation_greedy")
    scr, scf = se.get("confidence_real_text", {}), se.get("confidence_free_generation", {})
    crow = [["real validation text: the model's argmax", num(cr["mean_argmax_prob"]), num(cr["mean_nll"]),
             f'<span class="seed">{num(scr.get("mean_argmax_prob"))} / {num(scr.get("mean_nll"))}</span>'],
            [f'free generation ({esc(cf["sampler"])}): the chosen token', num(cf["mean_chosen_prob"]), num(cf["mean_nll"]),
             f'<span class="seed">{num(scf.get("mean_chosen_prob"))} / {num(scf.get("mean_nll"))}</span>']]
    if cg:
        crow.append(["free generation (greedy): the chosen token", num(cg["mean_chosen_prob"]), num(cg["mean_nll"]), "–"])
    lead = e.get("teacher_forcing_with_lead_in", {})
    return "\n".join([
        '<h2 id="exposure">3 · Training vs inference: one wrong token (seed §3.2.2, §3.7)</h2>',
        f'<h3>Teacher forcing on <span class="poem">{esc(e["teacher_forcing_snippet"])}</span> (validation text)</h3>',
        table(["pos", "context", "truth", "loss", "seed (truth)", "top-3"], rows, ["num", "", "", "num", "num", ""], id="tf-table"),
        f'<p>Mean loss <b>{num(e["teacher_forcing_mean_loss"])}</b>, perplexity <b>{num(e["teacher_forcing_perplexity"], 1)}</b> '
        f'(seed {num(se.get("teacher_forcing_mean_loss"))}, {num(se.get("teacher_forcing_perplexity"), 1)}). '
        f'With the {lead.get("lead_in_chars", 0)} preceding validation characters as context: mean loss {num(lead.get("mean_loss"))}.</p>',
        "<h3>Confidence: real text vs the model's own text (seed §3.7.3)</h3>",
        table(["", "mean probability", "mean NLL (nats)", "seed prob / NLL"], crow, ["", "num", "num", "num"], id="confidence-table"),
        f'<p>On real text the truth costs {num(cr["mean_truth_nll"])} nats on average over {cr["positions"]:,} positions.</p>',
        f'<h3>The shadow of one wrong token (seed §3.7.2; Δ over {e["perturbation_window"]} steps, tail = steps ≥ {e["perturbation_tail_from"]})</h3>',
        f'<p>Passage: <span class="poem">{unk_html(e["perturbation_passage"])}</span></p>',
        table(["k", "truth", "model wanted", "next Δloss", "peak", "tail mean", "steps to half", "seed (next, peak, tail, half)"],
              prow, ["num", "", "", "num", "num", "num", "num", "seed"], id="perturbation-table"),
        _fig(figs, "fig_perturbation_shadow.png", "Δloss per step after replacing one true token; dashed: the seed's k = 8 curve."),
    ])


def _cache(case: dict, seed: dict, figs: dict) -> str:
    out = ['<h2 id="cache">4 · The KV cache: exact, and how it breaks (seed §3.4, §3.9)</h2>']
    c = case.get("cache_exact")
    if c:
        sc = seed.get("cache_exact", {})
        ok = c["prefill_max_abs_dlogit"] == 0.0 and c["incremental_max_abs_dlogit"] < 1e-4
        out.append(table(["phase", "max |Δlogit| ours", "seed"], [
            ["prefill (must be bit-identical)", _fmt(c["prefill_max_abs_dlogit"], "e"), _fmt(sc.get("prefill_max_abs_dlogit"), "e")],
            ["incremental decode (< 1e-4)", _fmt(c["incremental_max_abs_dlogit"], "e"), _fmt(sc.get("incremental_max_abs_dlogit"), "e")],
            ["chunked prefill, chunks of 4", _fmt(c.get("chunk4_max_abs_dlogit"), "e"), "–"]],
            ["", "num", "num seed"], id="cache-exact-table")
            + f'<p>Verdict: <span class="{"ok" if ok else "warn"}">{esc(c.get("verdict"))}</span></p>')
    bugs = case.get("cache_bugs")
    if bugs:
        sb = {r["impl"]: r for r in seed.get("cache_bugs", [])}
        rows = [[f"<code>{esc(b['impl'])}</code>", esc(b["first_diff_step"]), _fmt(b["max_abs_dlogit"], "e"), esc(b["text_divergences"]),
                 f'<span class="{"ok" if b.get("as_expected", True) else "warn"}">{esc(b["verdict"])}'
                 f'{" (as expected)" if b.get("as_expected") else " (NOT as expected)" if "as_expected" in b else ""}</span>',
                 f'<span class="seed">{esc(sb.get(b["impl"], {}).get("first_diff_step"))}, {esc(sb.get(b["impl"], {}).get("max_abs_dlogit"))}, '
                 f'{esc(sb.get(b["impl"], {}).get("text_divergences"))}</span>'] for b in bugs]
        out.append("<h3>Five cache implementations vs full recomputation (seed §3.9.1)</h3>"
                   + table(["implementation", "first diff step", "max |Δlogit|", "text divergences", "verdict", "seed (step, Δ, texts)"],
                           rows, ["", "num", "num", "num", "", "seed"], id="cache-bugs-table"))
    mn = case.get("mask_noop")
    if mn:
        sm = seed.get("mask_noop", {})
        out.append("<h3>no_mask: invisible one token at a time, visible in chunks (seed §3.9.4)</h3>"
                   + table(["", "max |Δlogit| ours", "seed"], [[esc(k), _fmt(v, "e"), _fmt(sm.get(k), "e")] for k, v in mn.items()],
                           ["", "num", "num seed"], id="mask-noop-table"))
    t = case.get("cache_timing")
    if t and t.get("rows"):
        tf = t["token_forwards"]
        st = [r for r in seed.get("cache_timing", {}).get("rows", []) if r["device"] == "cpu"]
        sb = {r["batch"]: r for r in st}
        rows = [[str(r["batch"]), num(r["naive_s"]), num(r["cached_s"]), f'{r["speedup"]:.2f}×', f'{r["compute_ratio"]:.1f}×',
                 f'<span class="seed">{num(sb.get(r["batch"], {}).get("naive_s"))} / {num(sb.get(r["batch"], {}).get("cached_s"))} = '
                 f'{num(sb.get(r["batch"], {}).get("speedup"), 2)}×</span>'] for r in t["rows"]]
        load = case.get("meta", {}).get("load_average")
        load_txt = f"; load average {load[0]:.1f} when the run started — wall-clock numbers are only as quiet as the machine" if load else ""
        out.append(f"<h3>Compute saved vs time saved (seed §3.3.2, §3.4.4; {t['threads']} CPU threads{esc(load_txt)})</h3>"
                   f'<p>Token forwards for P = {t["prompt_len"]}, N = {t["new_tokens"]}: naive {tf["naive_counted"]:,} '
                   f'(formula Σ(P+i) = {tf["naive_formula"]:,}), cached {tf["cached_counted"]:,}; one pass over all '
                   f'{tf["single_pass"]} tokens would be {tf["formula_ratio"]}× cheaper than naive.</p>'
                   + table(["batch", "naive s", "cached s", "speed-up", "compute ratio", "seed CPU"], rows,
                           ["num"] * 5 + ["seed"], id="timing-table"))
    sc = case.get("cache_scaling")
    if sc and sc.get("rows"):
        ss = {r["new_tokens"]: r for r in seed.get("cache_scaling", {}).get("rows", []) if r["device"] == "cpu"}
        rows = [[str(r["new_tokens"]), num(r["naive_s"]), num(r["cached_s"]), f'{r["speedup"]:.2f}×', f'{r["compute_ratio"]:.1f}×',
                 f'<span class="seed">{num(ss.get(r["new_tokens"], {}).get("speedup"), 2)}× / {num(ss.get(r["new_tokens"], {}).get("compute_ratio"), 1)}×</span>']
                for r in sc["rows"]]
        note = " <b>(shrunk for --quick)</b>" if sc.get("shrunk_for_quick") else ""
        skipped = "".join(f'<p class="meta">{sk["new_tokens"]} new tokens skipped: the naive loop was predicted to take '
                          f'{sk["predicted_naive_s"]} s (budget {sk["budget_s"]:.0f} s).</p>' for sk in sc.get("skipped", []))
        out.append(f"<h3>A larger random model: {esc(sc['model'])}{note}</h3>"
                   + table(["new tokens", "naive s", "cached s", "speed-up", "compute ratio", "seed CPU speed-up / ratio"], rows,
                           ["num"] * 5 + ["seed"], id="scaling-table") + skipped)
    out.append(_fig(figs, "fig_cache_compute_vs_speed.png", "Fig. 3.4 — arithmetic saved by the KV cache (grey) vs measured wall-clock speed-up (teal)."))
    return "\n".join(out)


def _grid() -> str:
    return """
<h2 id="kvgrid-h">Experiment 3-3 · KV-cache workload (seed §3.8.3)</h2>
<p class="sub">Rows are forward passes (generation steps), columns token positions. Orange: positions the naive loop
recomputes; green/teal: the one new position each step really needs. The cached loop paints the prompt once, then one cell per step.</p>
<div class="card" id="kvgrid">
  <div class="controls">
    <label>tokens to generate N <output id="kv-len-val"></output><input id="kv-len" type="range" min="2" max="200" step="1" value="50"></label>
    <label>&nbsp;<button id="kv-play">Play step by step</button> <span class="meta">step <span id="kv-step"></span></span></label>
  </div>
  <div class="readout">
    <div>naive token forwards<b id="kv-naive-count" style="color:#ef6c00"></b></div>
    <div>cached token forwards<b id="kv-cached-count" style="color:#00838f"></b></div>
    <div>ratio<b id="kv-ratio"></b></div>
  </div>
  <div class="grids"><div><div class="meta">naive: recompute the prefix</div><canvas id="kv-naive" width="500" height="260"></canvas></div>
  <div><div class="meta">cached: prefill once, then one token per step</div><canvas id="kv-cached" width="500" height="260"></canvas></div></div>
</div>"""


def _safe_json(obj: Any) -> str:
    # A JSON block inside <script>: "</" must not appear literally.
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")


def render_report(case: dict, seed: dict | None = None, figures: dict[str, bytes] | None = None) -> str:
    """The report as one HTML string (figures rendered from ``case`` unless given)."""
    seed = seed_tables() if seed is None else seed
    figs = render_figures(case, seed) if figures is None else figures
    meta = case.get("meta", {})
    secs = meta.get("seconds", {})
    data = {k: case[k] for k in ("sampling", "cache_timing") if k in case}
    parts = [
        "<!doctype html>",
        '<html lang="zh-Hant"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>genprobe — the two faces of training and inference: case study</title>",
        f"<style>{_asset('report.css')}</style></head><body><main>",
        "<h1>Two faces of one model: the case study</h1>",
        '<p class="sub">Every measurement of the seed chapter, re-run on our own character-level Tang-poem GPT, '
        "with the seed's figures beside ours.</p>",
        f'<p class="meta">genprobe {esc(meta.get("genprobe"))} · torch {esc(meta.get("torch"))} · {esc(meta.get("device", "cpu"))}, '
        f'{esc(meta.get("threads"))} threads · {"quick run" if meta.get("quick") else "full run"} · {esc(meta.get("created_utc"))}'
        + (f' · experiments {sum(secs.values()):.0f} s' if secs else "") + "</p>",
        '<nav><a href="#headline-h">headline</a><a href="#decoding">decoding</a><a href="#sampling">sampling</a>'
        '<a href="#lab-h">sampling lab</a><a href="#trap-h">order trap</a><a href="#exposure">exposure</a>'
        '<a href="#cache">KV cache</a><a href="#kvgrid-h">workload grid</a></nav>',
        '<h2 id="headline-h">Headline: ours beside the seed\'s</h2>',
        _headline(case, seed),
        _findings(case),
    ]
    if "decoding" in case:
        parts.append(_decoding(case, seed, figs))
    if "sampling" in case:
        parts += [_sampling(case, seed, figs), _lab(), _trap(case)]
    if "exposure" in case:
        parts.append(_exposure(case, seed, figs))
    if any(k in case for k in ("cache_exact", "cache_bugs", "cache_timing")):
        parts.append(_cache(case, seed, figs))
    parts.append(_grid())
    parts += [f'<script type="application/json" id="case-data">{_safe_json(data)}</script>',
              f"<script>{_asset('report.js')}</script>", "</main></body></html>"]
    return "\n".join(p for p in parts if p)


def write_report(case: dict, out_dir: str | Path, seed: dict | None = None, figures: dict[str, bytes] | None = None) -> Path:
    """Write ``report.html`` into ``out_dir`` atomically and return its path."""
    path = Path(out_dir) / "report.html"
    atomic_write_text(path, render_report(case, seed, figures))
    return path
