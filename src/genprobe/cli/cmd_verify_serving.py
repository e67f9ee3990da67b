"""``genprobe verify-serving MODEL --engine vllm``: does a serving deployment compute the model's log-probabilities?

Serves MODEL with vLLM once per ``--dtypes`` entry and compares ``prompt_logprobs`` and per-step top-k
``logprobs`` (greedy) with float32 recomputation, phase by phase: prompts alone, a mixed-length batch
(continuous batching), a shared prefix with prefix caching on and off, chunked prefill. Exit status
as verify-cache: 0 when no phase reaches ``--fail-on`` (default bug), 1 when one does, 2 on bad input
(or when the engine is not installed, or cannot start: one line naming the setting to change).

The engine is sized to the checks, not to the model (:func:`genprobe.serving.verify.sized_for_checks`):
``--max-model-len`` defaults to the longest prompt (at least 4 × max(token budget, KV block)) plus
``--max-new-tokens``, rounded up to a KV block, and the KV cache to an explicit byte budget for the batch
phase's 8 sequences of that length (layers × KV heads × head dim × 4 bytes, plus headroom); SmolLM2-135M
gets 160 positions and 85 MiB instead of 8,192 positions and a fraction of RAM.
"""

from __future__ import annotations

import argparse
import sys

from ._common import (
    Accumulate,
    add_json_flag,
    add_max_new_tokens,
    add_model_argument,
    add_prompt_arguments,
    emit_json,
    info,
    read_prompts,
)
from ._vllm_args import add_engine_arguments, engine_options, vllm_missing

FAIL_ON = {"bug": ("bug",), "suspicious": ("suspicious", "bug"), "small": ("small", "suspicious", "bug")}


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``verify-serving`` sub-command."""
    p = sub.add_parser(
        "verify-serving",
        help="check a vLLM deployment's log-probabilities against float32 recomputation "
        "(batching, prefix cache, chunked prefill, dtype)",
        description="Serve MODEL with vLLM and compare its prompt and per-step top-k log-probabilities (greedy) with "
        "float32 recomputation of the same tokens: prompts alone, a mixed-length batch, a shared prefix with prefix "
        "caching on and off, prompts longer than --max-num-batched-tokens (chunked prefill); once per --dtypes entry. "
        "Verdicts on verify-cache's scale over max |Δ log p|; a differing top-1 token is at least 'suspicious'. "
        "The engine's context and KV cache are sized to these checks unless --max-model-len / "
        "--kv-cache-memory-bytes / --gpu-memory-utilization say otherwise.",
    )
    add_model_argument(p)
    p.add_argument("--engine", choices=("vllm",), default="vllm", help="serving engine (default vllm)")
    p.add_argument(
        "--reference", metavar="MODEL", help="the weights the deployment should serve (default: MODEL itself)"
    )
    p.add_argument(
        "--dtypes",
        nargs="+",
        action=Accumulate,
        default=["float32", "bfloat16"],
        choices=("float32", "bfloat16", "float16"),
        help="deployment dtypes, one engine each (default float32 bfloat16)",
    )
    add_max_new_tokens(p, 16)
    p.add_argument("--top-k", type=int, default=5, help="log-probabilities compared per position (default 5)")
    add_prompt_arguments(p, help_default=" (default: seeded random token ids)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random prompts (default 0)")
    add_engine_arguments(p, max_num_batched_tokens=32, max_num_seqs=32, block_size=32)
    p.add_argument("--noise", type=float, default=1e-4, help="float-noise threshold on |Δ log p| (default 1e-4)")
    p.add_argument("--bug", type=float, default=1.0, help="bug threshold on max |Δ log p| (default 1.0)")
    p.add_argument(
        "--fail-on",
        choices=sorted(FAIL_ON),
        default="bug",
        help="lowest phase verdict that makes the exit status 1 (default bug)",
    )
    add_json_flag(p)
    p.set_defaults(func=run)


def _options(args: argparse.Namespace):
    return engine_options(args, seed=args.seed)


def _encode_prompts(args: argparse.Namespace) -> list[list[int]]:
    texts = read_prompts(args)
    if not texts:
        return []
    from ..model.load import load_model

    m = load_model(args.reference or args.model)
    return [m.encode(t) for t in texts]


def run(args: argparse.Namespace) -> int:
    """Run every phase per dtype, print the table; exit 1 when a phase reaches --fail-on."""
    from ..serving.verify import verify_serving
    from ..verify.compare import Thresholds

    if vllm_missing("verify-serving"):
        return 2
    th = Thresholds(noise=args.noise, bug=args.bug, suspicious=max(args.noise, min(1e-3, args.bug)))
    report = verify_serving(
        args.model,
        args.reference,
        dtypes=args.dtypes,
        options=_options(args),
        prompts=_encode_prompts(args),
        steps=args.max_new_tokens,
        top_k=args.top_k,
        thresholds=th,
        seed=args.seed,
        log=info,
    )
    failing = [f"{p.dtype}/{p.phase}" for p in report.phases if not p.skipped and p.verdict in FAIL_ON[args.fail_on]]
    rc = 1 if failing else 0
    print_table(report, file=sys.stderr if args.json else sys.stdout)
    if failing:
        info(f"FAIL: {', '.join(failing)}")
    if args.json:
        emit_json({**report.to_dict(), "failing": failing, "exit_status": rc})
    return rc


def _fmt(x: float | None, spec: str = ".3g") -> str:
    return "—" if x is None else format(x, spec)


def _first(d: dict | None) -> str:
    if not d:
        return "—"
    return f"req {d['request']} {d['where']} {d['index']}" + (" (top-1)" if d["top1_mismatch"] else "")


def _cached(p) -> str:
    """Prompt tokens served from the prefix cache, over the tokens shared with the cached request when known."""
    c = _fmt(p.cached_tokens, "d")
    return c if p.shared_tokens is None else f"{c}/{p.shared_tokens}"


def print_table(report, file=None) -> None:
    """One row per (dtype, phase): max |Δ log p| over the top-k, top-1 agreement, first divergence, verdict."""
    out = file or sys.stdout
    head = (
        f"{'dtype':<9} {'phase':<16} {'req':>4} {'pos':>5} {'max |Δlogp|':>12} {'top-1 agree':>11} "
        f"{'first divergence':>26} {'cached':>9} {'chunks':>6} {'verdict':>10}"
    )
    print(head, file=out)
    print("-" * len(head), file=out)
    for p in report.phases:
        if p.skipped:
            print(f"{p.dtype:<9} {p.phase:<16} skipped: {p.skipped}", file=out)
            continue
        agree = "—" if p.top1_agreement is None else f"{p.top1_agreement:.4f}"
        print(
            f"{p.dtype:<9} {p.phase:<16} {p.requests:>4} {p.positions:>5} "
            f"{_fmt(p.max_abs_dlogp, '.3g'):>12} {agree:>11} "
            f"{_first(p.first_divergence):>26} {_cached(p):>9} {_fmt(p.prefill_chunks, 'd'):>6} "
            f"{p.verdict:>10}",
            file=out,
        )
        if p.note:
            print(f"{'':<27}note: {p.note}", file=out)
    th = report.thresholds
    print("cached: prompt tokens served from the prefix cache (/ tokens shared with the cached request)", file=out)
    print(
        f"verdict scale (verify-cache's): < {th.noise:g} pass, < {th.suspicious:g} small, ≤ {th.bug:g} suspicious, "
        f"> {th.bug:g} bug, on max |Δ log p| over the top-{report.top_k}; "
        "a differing top-1 token is at least suspicious. "
        f"reference: float32 recomputation of {report.reference}.",
        file=out,
    )
