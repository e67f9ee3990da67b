"""Where the microseconds of a decode step go: ours (eager, compiled) beside CTranslate2, same weights.

For one model and batch size, from whole greedy generations of 1, 2 and ``--new-tokens`` tokens
(repetitions interleaved, medians; see ``bench_stats.py``):

- per-step cost ``(t(n) - t(2)) / (n - 2)`` of each engine: for our compiled path this is the cost
  of one iteration *inside* the compiled loop (every step after the prefill is one call);
- fixed cost per generation ``t(1)`` (prefill, first step, setup) and, for the compiled path, the
  cost of entering the compiled loop ``t(2) - t(1) - step``;
- rooflines of this machine: float32 read bandwidth (a sum over a buffer the size of the weights)
  and GEMM throughput on the step's own matrix shapes, so a step's time can be compared with the
  time reading the weights or doing the step's multiply-adds would take at best;
- the eager step's top operators from ``torch.profiler`` (self CPU time per step).

    python benchmarks/bench_profile.py --model 58m --batch 1 --threads 2
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_engines import EngineUnavailable, make_engine  # noqa: E402
from bench_stats import interleaved, load_average, median_seconds  # noqa: E402
from generate_speed import load_bundle  # noqa: E402

_best_of = median_seconds  # median seconds of ``reps`` calls after one warm-up


def rooflines(model: torch.nn.Module, batch: int, reps: int) -> dict:
    """Read bandwidth over a weights-sized buffer and GEMM GFLOP/s on the step's linear shapes."""
    weights = [p for p in model.parameters() if p.dim() == 2]
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    buf = torch.ones(nbytes // 4)
    read_s = _best_of(lambda: buf.sum(), reps)
    x = {p.shape[1]: torch.randn(batch, p.shape[1]) for p in weights}
    flops = 2 * batch * sum(p.numel() for p in weights)  # embedding tables counted once: the lm head reads wte
    mm_s = _best_of(lambda: [x[p.shape[1]] @ p.t() for p in weights], reps)
    return {
        "weight_bytes": nbytes,
        "read_GBps": nbytes / read_s / 1e9,
        "read_weights_us": 1e6 * read_s,
        "matmul_flops_per_step": flops,
        "matmuls_us": 1e6 * mm_s,
        "matmul_GFLOPs": flops / mm_s / 1e9,
    }


def step_costs(bundle, prompt: list[int], batch: int, n: int, reps: int, names: list[str]) -> dict:
    """Per-step and fixed costs of each engine from generations of 1, 2 and ``n`` tokens."""
    prompts = [list(prompt)] * batch
    runs, skipped = {}, {}
    for name in names:
        try:
            e = make_engine(name, bundle, prompts, n)
        except EngineUnavailable as exc:
            skipped[name] = str(exc)
            continue
        e.run()
        for k in (1, 2, n):
            runs[f"{name}@{k}"] = lambda e=e, k=k: e.run(k)
    series, _ = interleaved(runs, reps)
    out = {}
    for name in names:
        if f"{name}@1" not in series:
            continue
        t1, t2, tn = (series[f"{name}@{k}"].median for k in (1, 2, n))
        step = (tn - t2) / (n - 2)
        out[name] = {
            "first_token_us": 1e6 * t1,
            "step_us": 1e6 * step,
            "enter_loop_us": 1e6 * (t2 - t1 - step),
            "busy": any(series[f"{name}@{k}"].busy for k in (1, 2, n)),
        }
    return {"engines": out, "skipped": skipped}


def top_ops(bundle, prompt: list[int], batch: int, n: int, top: int = 12) -> list[dict]:
    """Self CPU time per step of the eager engine's operators (torch.profiler), largest first."""
    from torch.profiler import ProfilerActivity, profile

    from genprobe.engine.generate import generate

    prompts = [list(prompt)] * batch
    generate(bundle.model, prompts, n)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        generate(bundle.model, prompts, n)
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return [{"op": e.key, "calls_per_step": e.count / n, "self_us_per_step": e.self_cpu_time_total / n} for e in rows]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default", choices=["default", "58m"])
    ap.add_argument("--ckpt", default=None)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--new-tokens", type=int, default=50)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--engines", nargs="+", default=["cached", "compiled", "ct2", "ct2-1t"])
    ap.add_argument("--out", type=Path, default=None, help="write profile-<model>-b<batch>.json here")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    bundle, prompt = load_bundle(args.model, args.ckpt)
    try:
        with torch.inference_mode():
            roof = rooflines(bundle.model, args.batch, args.reps)
        load = load_average()
        costs = step_costs(bundle, prompt, args.batch, args.new_tokens, args.reps, args.engines)
        ops = top_ops(bundle, prompt, args.batch, args.new_tokens)
    finally:
        bundle.close()
    result = {
        "model": bundle.source,
        "parameters": bundle.model.num_parameters(),
        "batch": args.batch,
        "threads": torch.get_num_threads(),
        "load_average": load,
        "roofline": roof,
        **costs,
        "eager_top_ops": ops,
    }
    print(f"{bundle.source}, batch {args.batch}, {torch.get_num_threads()} threads, load {load}")
    print(
        f"  weights {roof['weight_bytes'] / 1e6:.1f} MB: read at best in {roof['read_weights_us']:.0f} µs "
        f"({roof['read_GBps']:.1f} GB/s); the step's matmuls alone (torch) {roof['matmuls_us']:.0f} µs "
        f"({roof['matmul_GFLOPs']:.1f} GFLOP/s)"
    )
    for k, c in result["engines"].items():
        print(
            f"  {k:9s} step {c['step_us']:9.1f} µs | first token {c['first_token_us']:9.1f} µs"
            f" | entering the loop {c['enter_loop_us']:8.1f} µs{' BUSY' if c['busy'] else ''}"
        )
    print("  eager step, top operators (self µs per step):")
    for o in ops:
        print(f"    {o['self_us_per_step']:9.1f} µs  x{o['calls_per_step']:5.1f}  {o['op']}")
    if args.out:
        from genprobe._io import atomic_write_json

        args.out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(args.out / f"profile-{args.model}-b{args.batch}.json", result)
    else:
        json.dump(result, sys.stdout, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
