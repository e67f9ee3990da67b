"""A repaired model served by vLLM: does it loop as often as ``loops repair`` measured with our engine?

Rebuilds the repair's held-out validation prompts from its ``repair.json`` (the bundled Tang openings, or
the prompt file it names: the same disjoint split), scans them on the patched model (``loops apply --out``)
through vLLM and through genprobe's engine in the same run, and prints, per measure, the rate
``loops repair`` reported, our engine's rate now and vLLM's, each with its Wilson 95% interval, whether
vLLM's rate lies in the repair's interval, and the per-prompt verdict and token agreement.

    python benchmarks/loop_served_repair.py PATCHED_MODEL REPAIR_JSON [--json]

The exact-loop rate is the repair's target; the degenerate rate (exact, near or repetitive tail) is
reported beside it because a search that optimises one rate can game it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import IO

from genprobe._io import json_safe

MEASURES = ("loop_rate", "degenerate_rate", "near_loop_rate", "repetitive_rate")


def _inputs(report: dict, tokenizer, cfg):
    from genprobe.corpus.inputs import read_prompt_file
    from genprobe.loops.study import RepairInputs

    source = report["inputs"]["prompt_source"]
    if source == "tang-heldout-openings":
        inputs = RepairInputs.tang(tokenizer, cfg)
    elif source.startswith("file:"):
        inputs = RepairInputs.from_prompts(read_prompt_file(source[5:]), "", cfg)
    else:
        raise ValueError(f"cannot rebuild the prompts of source {source!r}")
    want = report["inputs"]["validate"]["first"]
    if inputs.validate[: len(want)] != want:
        raise ValueError(f"rebuilt validation prompts {inputs.validate[:3]} differ from the report's {want}")
    return inputs.validate


def _config(report: dict):
    from genprobe.loops.study import RepairConfig
    from genprobe.metrics.degeneracy import LoopSettings

    c = report["config"]
    keys = ("n_direction", "n_search", "n_validate", "prefix_chars", "max_new_tokens", "batch_size", "seed")
    return RepairConfig(**{k: c[k] for k in keys}, loop=LoopSettings(**c["loop"]))


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; with ``--json`` stdout holds the JSON alone: what vLLM or a native library prints goes to
    stderr (``genprobe._io.json_stdout``)."""
    from genprobe._io import json_stdout

    with json_stdout("--json" in (sys.argv[1:] if argv is None else argv)) as json_out:
        return _main(argv, json_out)


def _main(argv: list[str] | None, json_out: IO[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="the patched model (loops apply --out DIR)")
    ap.add_argument("repair_json", type=Path, help="repair.json of the loops repair run that made the patch")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of our engine (default 1)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    from dataclasses import replace

    import torch

    from genprobe.loops.scan import scan_batches
    from genprobe.loops.study import LoopStudy
    from genprobe.model.load import load_model
    from genprobe.serving.engine import EngineOptions, shared_engine
    from genprobe.serving.scan import compare_loop_rates, vllm_batches

    torch.set_num_threads(args.threads)
    report = json.loads(args.repair_json.read_text(encoding="utf-8"))
    cfg = _config(report)
    model = load_model(args.model)
    study = LoopStudy(model, cfg)
    texts = _inputs(report, model.tokenizer, cfg)
    ids = study.encode(texts)
    eng = shared_engine(
        args.model, EngineOptions(max_num_seqs=64, max_num_batched_tokens=512, kv_cache_memory_bytes=256 << 20)
    )
    t0 = time.perf_counter()
    ours = study.scan(ids, texts, desc="ours")
    t1 = time.perf_counter()
    served = scan_batches(vllm_batches(eng), ids, replace(study.options, desc="vllm"), texts)
    t2 = time.perf_counter()
    after = report["validation"]["after"]
    rows = []
    for m in MEASURES:
        rep_ci = after[m + "_ci95"]
        v = getattr(served.summary, m)
        rows.append(
            {
                "measure": m,
                "repair": after[m],
                "repair_ci95": rep_ci,
                "ours": getattr(ours.summary, m),
                "vllm": v,
                "vllm_ci95": getattr(served.summary, m + "_ci95"),
                "vllm_within_repair_ci": rep_ci[0] <= v <= rep_ci[1],
            }
        )
    out = {
        "model": args.model,
        "repair": str(args.repair_json),
        "prompts": len(ids),
        "max_new_tokens": cfg.max_new_tokens,
        "rows": rows,
        "agreement": json_safe(compare_loop_rates(ours, served)),
        "seconds": {"ours": t1 - t0, "vllm": t2 - t1, "vllm_startup": eng.startup_seconds},
        "engine": json_safe(eng.options),
    }
    _print(out, sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(out, indent=2), file=json_out)
    return 0 if all(r["vllm_within_repair_ci"] for r in rows) else 1


def _print(out: dict, file) -> None:
    print(
        f"{out['model']}: {out['prompts']} validation prompts of {out['repair']}, {out['max_new_tokens']} new tokens",
        file=file,
    )
    print(f"{'measure':<16} {'loops repair (CI95)':>26} {'ours now':>9} {'vLLM (CI95)':>26} {'in CI':>6}", file=file)
    for r in out["rows"]:
        ci, vci = r["repair_ci95"], r["vllm_ci95"]
        print(
            f"{r['measure']:<16} {r['repair']:>7.3f} [{ci[0]:.3f}, {ci[1]:.3f}] {r['ours']:>9.3f} "
            f"{r['vllm']:>7.3f} [{vci[0]:.3f}, {vci[1]:.3f}] {str(r['vllm_within_repair_ci']):>6}",
            file=file,
        )
    a = out["agreement"]
    print(
        f"per prompt: same loop verdict {a['verdict_agreement']:.4f}, same tokens {a['token_agreement']:.4f}", file=file
    )


if __name__ == "__main__":  # vLLM spawns worker processes: the guard is required
    sys.exit(main())
