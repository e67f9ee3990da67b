"""Where a decode step of a Llama-family model goes at one batch size: genprobe's compiled step beside the machine's
rooflines and ``transformers``' eager step.

- **step**: the cost of one decode step on genprobe's compiled path, ``(t(n) - t(s)) / (n - s)`` from whole greedy
  generations of ``--new-tokens`` (n) and fewer (s, the fewest with the same cache capacity) tokens (medians of
  ``--reps``; compilation is a warm-up, not counted);
- **rooflines** measured in the same run: reading the weight bytes a step reads (``torch.sum`` over a float32 buffer
  of that size) and doing the step's products (``torch.mm`` of (batch, K) x (K, N) for every linear layer of the
  model, oneDNN/MKL, each shape timed alone) — a step takes at least the larger of the two;
- the KV-cache bytes a step's attention reads at the static cache's capacity;
- **operators**: ``torch.profiler`` self-CPU time per step of the top operators of ``transformers``' eager step, and
  of genprobe's step where it is Python-driven (batches the stepwise strategy runs; the batch-1 loop is one C++ call
  and shows as one operator).

    python benchmarks/llama_profile.py --batch 1 --json > out/bench/profile-b1.json
    python benchmarks/llama_profile.py --batch 64
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_stats import median_seconds  # noqa: E402


def linear_shapes(module: torch.nn.Module) -> list[tuple[int, int]]:
    """(N, K) of every linear product of a step (the output layer included)."""
    return [(m.out_features, m.in_features) for m in module.modules() if hasattr(m, "in_features")]


def rooflines(module: torch.nn.Module, batch: int, step_bytes: int, reps: int) -> dict[str, float]:
    """Seconds to read ``step_bytes`` of float32 and to run the step's products at ``batch`` rows."""
    buf = torch.ones(step_bytes // 4)
    read = median_seconds(lambda: buf.sum(), reps)
    gemm = 0.0
    for n, k in linear_shapes(module):
        x, w = torch.randn(batch, k), torch.randn(k, n)
        gemm += median_seconds(lambda x=x, w=w: torch.mm(x, w), reps)
    return {"read_weights_s": read, "read_gb_per_s": step_bytes / read / 1e9, "products_s": gemm}


def top_ops(fn: Any, steps: int, top: int = 8) -> list[dict[str, Any]]:
    """The ``top`` operators by self CPU time of one call of ``fn``, per step (``steps`` steps in the call)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return [{"op": e.key, "ms_per_step": e.self_cpu_time_total / 1e3 / steps, "calls": e.count} for e in rows]


def profile(model_ref: str, batch: int, new_tokens: int, threads: int, reps: int) -> dict[str, Any]:
    """The figures of the module docstring for one batch size."""
    import genprobe
    from genprobe.engine.fast import compiled
    from genprobe.engine.generate import generate
    from genprobe.engine.runner import fast_module, runner_for

    torch.set_num_threads(threads)
    m = genprobe.load(model_ref)
    runner = runner_for(m)
    prompts = torch.randint(1000, 40000, (batch, 8), generator=torch.Generator().manual_seed(0)).tolist()
    family = fast_module(runner)  # the LlamaFamily view the compiled path runs
    cfg = m.module.config
    capacity = compiled.static_capacity(8 + new_tokens, family.cfg.max_positions)
    # The shorter generation keeps the capacity (another capacity is another compiled program, minutes on SmolLM2).
    short = max(2, capacity // 2 - 8 + 1) if capacity > 64 else 2
    t_short = median_seconds(lambda: generate(runner, prompts, short, compile=True), reps)
    tn = median_seconds(lambda: generate(runner, prompts, new_tokens, compile=True), reps)
    step = (tn - t_short) / (new_tokens - short)
    kv_bytes = 2 * cfg.num_hidden_layers * batch * capacity * cfg.num_key_value_heads * cfg.head_dim * 4
    step_bytes = sum(p.numel() * p.element_size() for p in m.module.parameters())
    ids = torch.tensor(prompts)

    def hf_generate() -> None:
        with torch.no_grad():
            m.module.generate(input_ids=ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)

    hf_t = median_seconds(hf_generate, 1)
    return {
        "model": model_ref,
        "batch": batch,
        "threads": threads,
        "strategy": compiled.decode_strategy(family, batch),
        "step_ms": step * 1e3,
        "tok_per_s_steps": batch / step,
        "weight_bytes": step_bytes,
        "kv_cache_bytes_at_capacity": kv_bytes,
        "capacity": capacity,
        "rooflines": rooflines(m.module, batch, step_bytes, reps),
        "transformers_ms_per_token_step": hf_t / new_tokens * 1e3,
        "genprobe_ops": top_ops(lambda: generate(runner, prompts, new_tokens, compile=True), new_tokens),
        "transformers_ops": top_ops(hf_generate, new_tokens),
    }


def main(argv: list[str] | None = None) -> int:
    """Run it; with ``--json`` stdout holds the JSON alone (``genprobe._io.json_stdout``: anything else goes to
    stderr)."""
    from genprobe._io import json_stdout

    with json_stdout("--json" in (sys.argv[1:] if argv is None else argv)) as out:
        return _main(argv, out)


def _main(argv: list[str] | None, out: Any) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print the result as JSON only")
    args = ap.parse_args(argv)
    doc = profile(args.model, args.batch, args.new_tokens, args.threads, args.reps)
    if args.json:
        out.write(json.dumps(doc, indent=1) + "\n")
        return 0
    r = doc["rooflines"]
    print(f"{doc['model']} batch {doc['batch']}, {doc['threads']} threads, strategy {doc['strategy']}")
    print(f"genprobe step {doc['step_ms']:.2f} ms ({doc['tok_per_s_steps']:.1f} tok/s in steps)")
    print(f"  read {doc['weight_bytes'] / 1e6:.0f} MB of weights: {r['read_weights_s'] * 1e3:.2f} ms")
    print(f"  ({r['read_gb_per_s']:.1f} GB/s); the step's products alone (torch.mm): {r['products_s'] * 1e3:.2f} ms")
    print(f"  KV cache at capacity {doc['capacity']}: {doc['kv_cache_bytes_at_capacity'] / 1e6:.0f} MB")
    print(f"transformers: {doc['transformers_ms_per_token_step']:.2f} ms per step (prefill included)")
    for side in ("genprobe_ops", "transformers_ops"):
        print(side)
        for op in doc[side]:
            print(f"  {op['ms_per_step']:8.3f} ms/step  x{op['calls']:<6} {op['op'][:70]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
