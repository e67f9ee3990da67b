"""The headline comparison, ours beside the chapter's published figures (transcribed in ``seed_tables.json``, keyed
like ``ch3_case.json``), as plain rows (report, CLI, README)."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

#: (label, ours, the chapter's, kind); kind says how to format both values: int, f3, f2, pct, e (scientific), str.
Row = tuple[str, Any, Any, str]


def seed_tables() -> dict:
    """The transcribed seed figures (a fresh copy each call: safe to mutate)."""
    return json.loads((resources.files("genprobe.report") / "seed_tables.json").read_text(encoding="utf-8"))


def _first(rows: list[dict], key: str, value: Any) -> dict:
    return next((r for r in rows if r[key] == value), {})


def headline_rows(case: dict, seed: dict) -> list[Row]:
    """(label, ours, seed, kind) rows of the headline table (also used by the CLI and README)."""
    m, sm = case.get("model", {}), seed.get("model", {})
    rows: list[Row] = [
        ("parameters", m.get("params"), sm.get("params"), "int"),
        ("validation loss (nats)", m.get("val_loss"), sm.get("val_loss"), "f3"),
        ("unigram baseline CE (nats)", m.get("unigram_ce"), sm.get("unigram_ce"), "f3"),
        ("vocabulary coverage (1,200 chars)", m.get("coverage_1200"), sm.get("coverage_1200"), "pct"),
        ("<unk> share of corpus positions", m.get("unk_share"), sm.get("unk_share_claimed"), "pct"),
    ]
    if d := case.get("decoding"):
        seed_rows = seed.get("decoding", {}).get("rows", [])
        sg, sb = (_first(seed_rows, "strategy", name) for name in ("greedy", "greedy + ban <unk>"))
        g, b = d["rows"][0], d["rows"][1]
        sampled = [r for r in d["rows"] if not r["sampler"]["greedy"]]
        rows += [
            ("greedy distinct-2", g["distinct_2"], sg.get("distinct_2"), "f3"),
            ("greedy <unk> share", g["unk_share"], sg.get("unk_share"), "pct"),
            ("greedy + ban <unk> distinct-2", b["distinct_2"], sb.get("distinct_2"), "f3"),
            (
                "lowest distinct-2 among sampling strategies",
                min(r["distinct_2"] for r in sampled),
                min((r["distinct_2"] for r in seed_rows[2:]), default=None),
                "f3",
            ),
        ]
    if s := case.get("sampling"):  # our row and the chapter's
        ss = seed.get("sampling", {})
        e1, se1 = (_first(x.get("entropy_vs_temperature", []), "tau", 1.0) for x in (s, ss))
        n9, sn9 = (_first(x.get("nucleus_curve_tau_1", []), "p", 0.9) for x in (s, ss))
        t2, st2 = (_first(x.get("order_trap_top_p_0_9", []), "tau", 2.0) for x in (s, ss))
        rows += [
            ("entropy after the prompt at τ = 1 (nats)", e1.get("entropy"), se1.get("entropy"), "f3"),
            ("top-p 0.9 kept set at τ = 1", n9.get("kept"), sn9.get("kept"), "int"),
            (
                "order trap τ = 2: trunc→temp / temp→trunc",
                f"{t2.get('trunc_then_temp')} / {t2.get('temp_then_trunc')}",
                f"{st2.get('trunc_then_temp')} / {st2.get('temp_then_trunc')}",
                "str",
            ),
        ]
    if e := case.get("exposure"):
        seed_loss = seed.get("exposure", {}).get("teacher_forcing_mean_loss")
        rows.append(
            ("teacher forcing on 已驚飛。方從列子御: mean loss", e["teacher_forcing_mean_loss"], seed_loss, "f3")
        )
    return rows + _cache_rows(case, seed)


def _cache_rows(case: dict, seed: dict) -> list[Row]:
    """The KV cache rows: its logits against the naive path, its token forwards and CPU speed-up."""
    rows: list[Row] = []
    if c := case.get("cache_exact"):
        sc = seed.get("cache_exact", {})
        rows += [
            (f"KV cache {phase} max |Δlogit|", c[f"{phase}_max_abs_dlogit"], sc.get(f"{phase}_max_abs_dlogit"), "e")
            for phase in ("prefill", "incremental")
        ]
    t = case.get("cache_timing")
    if t and t.get("rows"):
        seed_cpu1: dict[str, Any] = next(
            (r for r in seed.get("cache_timing", {}).get("rows", []) if r["device"] == "cpu" and r["batch"] == 1), {}
        )
        seed_tf = seed.get("token_forwards", {})
        rows += [
            (
                "token forwards naive / cached (P=7, N=50)",
                f"{t['token_forwards']['naive_counted']:,} / {t['token_forwards']['cached_counted']:,}",
                f"{seed_tf.get('naive_counted', '–'):,} / {seed_tf.get('cached_counted', '–'):,}",
                "str",
            ),
            ("CPU wall-clock speed-up, batch 1", t["rows"][0]["speedup"], seed_cpu1.get("speedup"), "f2"),
        ]
    return rows
