"""Scaling: tokens/s vs batch size, and decode tokens/s vs context length, for every engine; table + PNG.

Batch scaling generates ``--new-tokens`` after the 7-token prompt at each batch size. Context scaling
isolates the decode step at a given context: for context length L it times ``n`` new tokens after a
prompt of ``L - n`` tokens and a one-token generation after the same prompt, and reports
``batch x (n - 1) / (t(n) - t(1))`` — the prefill and the first step cancel out. Repetitions are
interleaved across engines as in the main table (see ``bench_stats.py``); medians are reported.
"""

from __future__ import annotations

import argparse
import io
from typing import Any, TextIO

import torch
from bench_engines import Bundle, EngineUnavailable, make_engine
from bench_stats import interleaved, load_average


def _engines(bundle: Bundle, names: list[str], prompts: list[list[int]], n: int, skipped: dict[str, str]) -> dict:
    out = {}
    for name in names:
        try:
            e = make_engine(name, bundle, prompts, n)
            e.run()  # warm-up (and compilation for this shape)
        except EngineUnavailable as exc:
            skipped[name] = str(exc)
            continue
        out[name] = e
    return out


def batch_scaling(
    bundle: Bundle, names: list[str], prompt: list[int], batches: list[int], n: int, reps: int
) -> list[dict]:
    """Tokens/s (median, min-time) per engine at each batch size."""
    rows = []
    for B in batches:
        skipped: dict[str, str] = {}
        engines = _engines(bundle, names, [list(prompt)] * B, n, skipped)
        load = load_average()
        series, _ = interleaved({k: e.run for k, e in engines.items()}, reps)
        rows.append(
            {
                "batch": B,
                "load_average": load,
                "tokens_per_s": {k: B * n / s.median for k, s in series.items()},
                "tokens_per_s_min_time": {k: B * n / s.best for k, s in series.items()},
                "busy": sorted(k for k, s in series.items() if s.busy),
                "skipped": skipped,
            }
        )
    return rows


def context_scaling(bundle: Bundle, names: list[str], contexts: list[int], n: int, batch: int, reps: int) -> list[dict]:
    """Decode tokens/s per engine at each context length (prefill and first step cancelled out)."""
    V = bundle.model.cfg.vocab_size
    rows = []
    for L in contexts:
        prompt = [(7 * i + 3) % (V - 2) + 2 for i in range(L - n)]  # real tokens, never <pad>/<unk>
        skipped: dict[str, str] = {}
        engines = _engines(bundle, names, [prompt] * batch, n, skipped)
        load = load_average()
        fns = {f"{k}:n": e.run for k, e in engines.items()} | {f"{k}:1": e.first_token for k, e in engines.items()}
        series, _ = interleaved(fns, reps)
        tps = {}
        for k in engines:
            dt = series[f"{k}:n"].median - series[f"{k}:1"].median
            tps[k] = batch * (n - 1) / dt if dt > 0 else None
        rows.append(
            {
                "context": L,
                "prompt_tokens": L - n,
                "batch": batch,
                "load_average": load,
                "decode_tokens_per_s": tps,
                "prefill_plus_first_ms": {k: 1e3 * series[f"{k}:1"].median for k in engines},
                "busy": sorted({k.split(":")[0] for k, s in series.items() if s.busy}),
                "skipped": skipped,
            }
        )
    return rows


def default_contexts(block: int, n: int) -> list[int]:
    """Context lengths from a short prompt up to the model's full context."""
    points = sorted({max(n + 8, block // 8), block // 4, block // 2, 3 * block // 4, block})
    return [c for c in points if c > n]


def plot(batch_rows: list[dict], ctx_rows: list[dict], title: str) -> bytes:
    """PNG: tokens/s vs batch (log-log) and decode tokens/s vs context."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    names = sorted(
        {k for r in batch_rows for k in r["tokens_per_s"]} | {k for r in ctx_rows for k in r["decode_tokens_per_s"]}
    )
    for k in names:
        xs = [r["batch"] for r in batch_rows if k in r["tokens_per_s"]]
        a.plot(xs, [r["tokens_per_s"][k] for r in batch_rows if k in r["tokens_per_s"]], marker="o", label=k)
        pts = [(r["context"], r["decode_tokens_per_s"][k]) for r in ctx_rows if r["decode_tokens_per_s"].get(k)]
        if pts:
            b.plot(*zip(*pts, strict=True), marker="o", label=k)
    a.set(xscale="log", yscale="log", xlabel="batch size", ylabel="tokens/s (median)", title="throughput vs batch")
    a.set_xscale("log", base=2)
    b.set(
        xlabel="context length (tokens)",
        ylabel="decode tokens/s (median)",
        yscale="log",
        title=f"decode vs context (batch {ctx_rows[0]['batch'] if ctx_rows else '?'})",
    )
    for ax in (a, b):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def table(batch_rows: list[dict], ctx_rows: list[dict]) -> str:
    """Markdown tables of both sweeps."""
    names = sorted({k for r in batch_rows for k in r["tokens_per_s"]})
    out = ["| batch | " + " | ".join(names) + " | load |", "|" + "---|" * (len(names) + 2)]
    for r in batch_rows:
        cells = (f"{r['tokens_per_s'][k]:,.0f}" if k in r["tokens_per_s"] else "–" for k in names)
        out.append(
            f"| {r['batch']} | "
            + " | ".join(cells)
            + f" | {r['load_average'] if r['load_average'] is None else round(r['load_average'], 1)} |"
        )
    names = sorted({k for r in ctx_rows for k in r["decode_tokens_per_s"]})
    out += ["", "| context | " + " | ".join(names) + " | load |", "|" + "---|" * (len(names) + 2)]
    for r in ctx_rows:
        t = r["decode_tokens_per_s"]
        out.append(
            f"| {r['context']} | "
            + " | ".join(f"{t[k]:,.0f}" if t.get(k) else "–" for k in names)
            + f" | {r['load_average'] if r['load_average'] is None else round(r['load_average'], 1)} |"
        )
    return "\n".join(out)


def run_scaling(
    bundle: Bundle, names: list[str], prompt: list[int], args: argparse.Namespace, show: TextIO
) -> dict[str, Any]:
    """Both sweeps; writes scaling PNG to ``args.out`` when given; returns the JSON-able result."""
    block = bundle.model.cfg.block_size
    n = args.new_tokens
    batch_rows = batch_scaling(bundle, names, prompt, args.scaling_batches, n, args.reps)
    n_ctx = max(4, block // 8)
    contexts = args.contexts or default_contexts(block, n_ctx)
    bad = [c for c in contexts if c <= n_ctx or c > block]
    if bad:
        raise SystemExit(
            f"--contexts must lie in ({n_ctx}, {block}] (decode {n_ctx} tokens, context length {block}); got {bad}"
        )
    ctx_rows = context_scaling(bundle, names, contexts, n_ctx, 1, args.reps)
    print("\n" + table(batch_rows, ctx_rows), file=show, flush=True)
    res = {"batch": batch_rows, "context": ctx_rows, "context_new_tokens": n_ctx, "threads": torch.get_num_threads()}
    if args.out:
        from genprobe._io import atomic_write_bytes, atomic_write_text

        args.out.mkdir(parents=True, exist_ok=True)
        size = f"{bundle.model.num_parameters():,} parameters"
        title = f"{bundle.source} ({size}), float32, greedy, {torch.get_num_threads()} threads"
        atomic_write_bytes(args.out / f"scaling-{args.model}.png", plot(batch_rows, ctx_rows, title))
        atomic_write_text(args.out / f"scaling-{args.model}.md", table(batch_rows, ctx_rows) + "\n")
    return res
