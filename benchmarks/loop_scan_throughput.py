"""Loop scan throughput: genprobe's engine vs vLLM on the same prompts, same sampler, same loop verdicts.

The model (``MODEL``: a genprobe checkpoint, default ``out/case/model``, or a transformers directory)
scans held-out Tang openings in the chanting setting (greedy, ``<unk>`` banned, ``--max-new-tokens``
after each) at batch 64 and batch 1 through :func:`genprobe.loops.scan.engine_batches` (our cached engine)
and :func:`genprobe.serving.scan.vllm_batches` (``LLM.generate``, ``batch_size`` prompts per call).
Repetitions are interleaved (ours, vLLM, ours, …) and the median wall time is reported as prompts/s;
the ratios are measured in this one run. The engine start-up is excluded and printed. Verdicts
(looping, period, onset) and tokens are compared prompt by prompt.

    python benchmarks/loop_scan_throughput.py [MODEL] [--prompts 256] [--batch1-prompts 32] [--reps 3] [--json]

vLLM's CPU backend binds its model threads to cores and reserves one core for the engine process: on a
2-core machine it computes on one core; our engine uses ``--threads`` (default 1, the same). Numbers on a
shared machine are noisy; rerun when it is quiet.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import IO

from genprobe._io import json_safe

REPO = Path(__file__).resolve().parents[1]


def _prompts(model, n: int) -> list[list[int]]:
    from genprobe.corpus.inputs import heldout_openings

    return [model.encode(t) for t in heldout_openings(model.tokenizer, n)]


def _verdicts(res) -> list[tuple]:
    return [(r.looping, r.measures.period, r.measures.onset) for r in res.records]


def _timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    res = fn()
    return time.perf_counter() - t0, res


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; with ``--json`` stdout holds the JSON alone: what vLLM or a native library prints goes to
    stderr (``genprobe._io.json_stdout``)."""
    from genprobe._io import json_stdout

    with json_stdout("--json" in (sys.argv[1:] if argv is None else argv)) as json_out:
        return _main(argv, json_out)


def _main(argv: list[str] | None, json_out: IO[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default=str(REPO / "out" / "case" / "model"))
    ap.add_argument("--prompts", type=int, default=256, help="prompts scanned at batch 64 (default 256)")
    ap.add_argument("--batch1-prompts", type=int, default=32, help="prompts scanned at batch 1 (default 32)")
    ap.add_argument("--max-new-tokens", type=int, default=57)
    ap.add_argument("--reps", type=int, default=3, help="interleaved repetitions (median reported)")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads of our engine (default 1, like vLLM's one compute core on a 2-core machine; "
        "more threads than free cores make every tiny op wait for a scheduler slice)",
    )
    ap.add_argument("--in-process", action="store_true", help="vLLM engine core in this process")
    ap.add_argument("--compile", action="store_true", help="let vLLM compile (default enforce_eager)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    import torch

    from genprobe.engine.loaded import load_model
    from genprobe.loops.scan import ScanOptions, chanting_sampler, engine_batches, scan_batches
    from genprobe.serving.engine import EngineOptions, shared_engine
    from genprobe.serving.scan import vllm_batches

    torch.set_num_threads(args.threads)
    model = load_model(args.model)
    prompts = _prompts(model, max(args.prompts, args.batch1_prompts))
    sampler = chanting_sampler(model.unk_id, model.eos_id)
    t0 = time.perf_counter()
    eng = shared_engine(
        args.model,
        EngineOptions(
            max_num_seqs=64,
            max_num_batched_tokens=max(256, 64 * 8),
            enforce_eager=not args.compile,
            kv_cache_memory_bytes=256 << 20,
            multiprocessing=not args.in_process,
        ),
    )
    startup = time.perf_counter() - t0
    N = args.max_new_tokens
    rows, agree = [], {}
    for batch, n in ((64, args.prompts), (1, args.batch1_prompts)):
        ps = prompts[:n]
        ours_t, vllm_t, ours, theirs = [], [], None, None
        for _ in range(args.reps):  # interleaved: machine noise hits both alike
            t, ours = _timed(
                lambda ps=ps, b=batch: scan_batches(engine_batches(model.runner), ps, ScanOptions(N, sampler, b))
            )
            ours_t.append(t)
            t, theirs = _timed(lambda ps=ps, b=batch: scan_batches(vllm_batches(eng), ps, ScanOptions(N, sampler, b)))
            vllm_t.append(t)
        o, v = statistics.median(ours_t), statistics.median(vllm_t)
        agree[batch] = {
            "verdicts": sum(a == b for a, b in zip(_verdicts(ours), _verdicts(theirs), strict=True)),
            "tokens": sum(a.tokens == b.tokens for a, b in zip(ours.records, theirs.records, strict=True)),
            "n": n,
            "loop_rate_ours": ours.summary.loop_rate,
            "loop_rate_vllm": theirs.summary.loop_rate,
        }
        rows.append(
            {
                "batch": batch,
                "prompts": n,
                "ours_prompts_per_s": n / o,
                "vllm_prompts_per_s": n / v,
                "vllm_over_ours": o / v,
                "ours_s": o,
                "vllm_s": v,
            }
        )
    out = {
        "model": args.model,
        "max_new_tokens": N,
        "reps": args.reps,
        "vllm_startup_s": startup,
        "threads": args.threads,
        "engine": json_safe(eng.options),
        "rows": rows,
        "agreement": agree,
    }
    _print(out, file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(out, indent=2), file=json_out)
    return 0 if all(a["verdicts"] == a["n"] for a in agree.values()) else 1


def _print(out: dict, file) -> None:
    print(
        f"loop scan, chanting setting, {out['max_new_tokens']} new tokens, median of {out['reps']} interleaved runs; "
        f"vLLM start-up {out['vllm_startup_s']:.1f} s (excluded)",
        file=file,
    )
    print(
        f"{'batch':>5} {'prompts':>7} {'ours p/s':>9} {'vLLM p/s':>9} {'vLLM/ours':>9} {'same verdicts':>14} "
        f"{'same tokens':>12} "
        f"{'loop rate ours / vLLM':>22}",
        file=file,
    )
    for r in out["rows"]:
        a = out["agreement"][r["batch"]]
        print(
            f"{r['batch']:>5} {r['prompts']:>7} {r['ours_prompts_per_s']:>9.1f} {r['vllm_prompts_per_s']:>9.1f} "
            f"{r['vllm_over_ours']:>8.2f}× {a['verdicts']:>7}/{a['n']:<6} {a['tokens']:>5}/{a['n']:<6} "
            f"{a['loop_rate_ours']:>10.3f} / {a['loop_rate_vllm']:.3f}",
            file=file,
        )


if __name__ == "__main__":  # vLLM spawns worker processes: the guard is required
    sys.exit(main())
