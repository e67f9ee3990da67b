"""A user's first compiled call on a model, with every cache empty, beside the steady state (issue #49).

In a child process whose genprobe and Inductor caches are new empty directories (so the kernels and the AOT programs
are built from nothing, as on a fresh machine), it times: loading the model; the first ``generate(..., compile=True)``
call (``--tokens`` greedy tokens after a ``--prompt-tokens``-token prompt) and its first token; the background build
of the programs that call started (``wait_for_builds``); then the steady state, the median of ``--reps`` calls. The
same with ``GENPROBE_AOT_BACKGROUND=0`` (``--foreground``) gives the old behaviour: the first call waits for the build.
Every call's tokens are checked equal to the first call's::

    python benchmarks/first_call.py smollm2 --threads 1
    python benchmarks/first_call.py /path/SmolLM2-135M-Instruct-Q4_0.gguf --weight-dtype int8 --narrow-output
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def child(args: argparse.Namespace) -> dict[str, object]:
    import torch

    import genprobe
    from genprobe.engine.fast.compiled import wait_for_builds
    from genprobe.engine.generate import generate

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    m = genprobe.load(args.model, weight_dtype=getattr(torch, args.weight_dtype), narrow_output=args.narrow_output)
    loaded = time.perf_counter()
    ids = m.encode("The history of the city begins with a small village by the river, where fishermen")
    prompt = [ids[: args.prompt_tokens]]
    first_token: list[float] = []

    def on_token(step: int, _: list[int]) -> None:
        if step == 0:
            first_token.append(time.perf_counter())

    runner = m
    start = time.perf_counter()
    first = generate(runner, prompt, args.tokens, compile=True, on_token=on_token).tokens
    first_done = time.perf_counter()
    wait_for_builds()
    built = time.perf_counter()
    rates, same = [], True
    for _ in range(args.reps):
        s = time.perf_counter()
        tokens = generate(runner, prompt, args.tokens, compile=True).tokens
        rates.append(args.tokens / (time.perf_counter() - s))
        same &= tokens == first
    return {
        "model": str(args.model),
        "background": os.environ.get("GENPROBE_AOT_BACKGROUND", "1") != "0",
        "load_s": round(loaded - t0, 2),
        "first_token_s": round(first_token[0] - start, 2),
        "first_token_from_start_s": round(first_token[0] - t0, 2),
        "first_call_s": round(first_done - start, 2),
        "first_call_tok_s": round(args.tokens / (first_done - start), 2),
        "build_after_first_call_s": round(built - first_done, 2),
        "steady_tok_s": round(statistics.median(rates), 2),
        "steady_tok_s_each": [round(r, 2) for r in rates],
        "tokens_equal_first_call": same,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--weight-dtype", default="float32", choices=["float32", "bfloat16", "int8"])
    ap.add_argument("--narrow-output", action="store_true")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--foreground", action="store_true", help="GENPROBE_AOT_BACKGROUND=0: the first call waits")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return 0
    with tempfile.TemporaryDirectory(prefix="genprobe-first-call-") as tmp:
        env = {**os.environ, "GENPROBE_CACHE_DIR": f"{tmp}/genprobe", "TORCHINDUCTOR_CACHE_DIR": f"{tmp}/inductor"}
        env["GENPROBE_AOT_BACKGROUND"] = "0" if args.foreground else "1"
        # a catalog name resolves in the real cache (the child's is empty): the child gets the directory
        argv = [a for a in sys.argv[1:] if a != "--foreground"]
        if not Path(args.model).exists():
            from genprobe.model.catalog import resolve_name

            argv[argv.index(args.model)] = str(resolve_name(args.model))
        proc = subprocess.run([sys.executable, __file__, *argv, "--child"], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
        return proc.returncode
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    for k, v in row.items():
        print(f"{k:28s} {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
