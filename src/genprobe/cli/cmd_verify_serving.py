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
import atexit
import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from .._io import json_safe
from ._common import (
    Accumulate,
    add_json_flag,
    add_max_new_tokens,
    add_model_argument,
    add_prompt_arguments,
    emit_json,
    info,
    out_dir,
    read_prompts,
)
from ._live import add_live_arguments, run_endpoint
from ._vllm_args import add_engine_arguments, engine_options

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
    add_model_argument(
        p,
        kinds={
            "vllm": ("checkpoint", "transformers", "name"),
            "llama.cpp": ("gguf", "name"),
            "endpoint": ("url",),
        },
    )
    p.add_argument("--engine", choices=("vllm",), default="vllm", help="serving engine (default vllm)")
    p.add_argument(
        "--backend",
        choices=("vllm", "llama.cpp", "endpoint"),
        default=None,
        help="vllm (the default for a model on disk: the model directory served by vLLM), llama.cpp (MODEL is a GGUF "
        "file, or a catalog name whose GGUF `genprobe fetch` kept: every position's logits against float32 "
        "recomputation of the same weights dequantized and against llama.cpp's own prefill; phases prefill, decode, "
        "batch, prompt_cache, prompt_cache_diverge, context_shift) or endpoint (the default for a URL: a live "
        "OpenAI-compatible server — vLLM, llama-cpp-python's server, any other — checked against --reference; "
        "phases prompt, greedy, prefix, concurrency, seed, limits, chat; docs/live-serving.md)",
    )
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
    _add_llamacpp_arguments(p)
    add_live_arguments(p)
    p.add_argument("--noise", type=float, default=1e-4, help="float-noise threshold on |Δ log p| (default 1e-4)")
    p.add_argument("--bug", type=float, default=1.0, help="bug threshold on max |Δ log p| (default 1.0)")
    p.add_argument(
        "--fail-on",
        choices=sorted(FAIL_ON),
        default="bug",
        help="lowest phase verdict that makes the exit status 1 (default bug)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="write verify-serving.json and the engine's own log (engine.log) into DIR (created if missing)",
    )
    p.add_argument(
        "--verbose",
        action="store_true",
        help="let the engine's log lines (vLLM's, llama.cpp's) reach the terminal instead of a log file",
    )
    add_json_flag(p)
    p.set_defaults(func=run)


def _add_llamacpp_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("llama.cpp (with --backend llama.cpp)")
    g.add_argument("--threads", type=int, default=1, help="llama.cpp and torch CPU threads (default 1)")
    g.add_argument(
        "--kv-type",
        choices=("f16", "f32"),
        default="f16",
        help="KV-cache element type (default f16, llama.cpp's default; f32 makes an F32 file exact float32 "
        "arithmetic, judged on recomputation)",
    )
    g.add_argument(
        "--n-ctx", type=int, default=256, help="context length (rounded up to 256 as llama.cpp does; default 256)"
    )
    g.add_argument("--n-keep", type=int, default=4, help="tokens the context shift keeps at the start (default 4)")


def _options(args: argparse.Namespace):
    return engine_options(args, seed=args.seed)


def _encode_prompts(args: argparse.Namespace) -> list[list[int]]:
    texts = read_prompts(args)
    if not texts:
        return []
    from ..model.load import load_model

    m = load_model(args.reference or args.model)
    return [m.encode(t) for t in texts]


def _to_log(path: Path) -> None:
    """At exit: what is still printed (vLLM stopping its engine) goes to the log, after the verdict."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


@contextmanager
def engine_log(args: argparse.Namespace) -> Iterator[Callable[[str], None]]:
    """What the engines print (vLLM: a warning per weight cast to bfloat16, start-up reports; llama.cpp: the loader)
    goes to ``--out``/engine.log, or a temporary file, named in one line at the end; yields the function genprobe's
    own progress is said with, on the terminal. ``--verbose``: nothing captured."""
    from .._io import output_to_file

    if args.verbose:
        yield info
        return
    if args.out is not None:
        out_dir(args.out, "verify-serving.json and engine.log").mkdir(parents=True, exist_ok=True)
        path = args.out / "engine.log"
    else:
        with tempfile.NamedTemporaryFile(prefix="genprobe-verify-serving-", suffix=".log", delete=False) as tmp:
            path = Path(tmp.name)
    with output_to_file(path) as terminal:
        yield lambda message: print(message, file=terminal, flush=True)
    atexit.register(_to_log, path)  # runs before the engine's own exit handler (registered earlier): its lines too
    lines = len(path.read_bytes().splitlines())
    if lines:
        info(f"the engine's own log: {path} ({lines} lines; --verbose prints them here)")


def _finish(args: argparse.Namespace, report, failing: list[str], table: Callable[..., None]) -> int:
    """The table, the failing phases, --json and --out; the exit status."""
    from .._io import atomic_write_json

    rc = 1 if failing else 0
    table(report, file=sys.stderr if args.json else sys.stdout)
    if failing:
        info(f"FAIL: {', '.join(failing)}")
    summary = {**json_safe(report), "failing": failing, "exit_status": rc}
    if args.out is not None:
        atomic_write_json(args.out / "verify-serving.json", summary)
    if args.json:
        emit_json(summary)
    return rc


def run(args: argparse.Namespace) -> int:
    """Run every phase per dtype, print the table; exit 1 when a phase reaches --fail-on."""
    from ..serving.verify import verify_serving
    from ..verify.compare import Thresholds

    th = Thresholds(noise=args.noise, bug=args.bug, suspicious=max(args.noise, min(1e-3, args.bug)))
    if args.backend == "endpoint":
        return run_endpoint(args, th, _finish, FAIL_ON[args.fail_on])
    if args.backend == "llama.cpp":
        return run_llamacpp(args, th)
    from ..serving._vllm import VLLMNotAvailableError, require_vllm_engine

    prompts = _encode_prompts(args)
    missing: VLLMNotAvailableError | None = None
    with engine_log(args) as say:
        try:  # importing vLLM prints too (Triton, deprecations): into the log with the rest
            require_vllm_engine()
        except VLLMNotAvailableError as exc:
            missing = exc
        else:
            report = verify_serving(
                args.model,
                args.reference,
                dtypes=args.dtypes,
                options=_options(args),
                prompts=prompts,
                steps=args.max_new_tokens,
                top_k=args.top_k,
                thresholds=th,
                seed=args.seed,
                log=say,
            )
    if missing is not None:
        print(f"genprobe verify-serving: error: {missing}", file=sys.stderr)
        return 2
    failing = [f"{p.dtype}/{p.phase}" for p in report.phases if not p.skipped and p.verdict in FAIL_ON[args.fail_on]]
    return _finish(args, report, failing, print_table)


def run_llamacpp(args: argparse.Namespace, th) -> int:
    """``--backend llama.cpp``: every phase on the GGUF file, the llama.cpp table; exit 1 when a phase reaches
    --fail-on, 2 when the bindings are missing."""
    import torch

    from ..serving.llamacpp import llama_cpp_problem

    problem = llama_cpp_problem()
    if problem:
        print(f"genprobe verify-serving: error: {problem}", file=sys.stderr)
        return 2
    from ..serving.llamacpp.scan import gguf_file_for
    from ..serving.llamacpp.verify import verify_serving_llamacpp

    if args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    torch.set_num_threads(args.threads)
    prompts = _encode_prompts(args)
    with engine_log(args) as say:
        report = verify_serving_llamacpp(
            gguf_file_for(args.model),
            args.reference or args.model,
            n_ctx=args.n_ctx,
            n_threads=args.threads,
            kv_type=args.kv_type,
            prompts=prompts,
            steps=args.max_new_tokens,
            n_keep=args.n_keep,
            thresholds=th,
            seed=args.seed,
            log=say,
        )
    failing = [p.phase for p in report.phases if not p.skipped and p.verdict in FAIL_ON[args.fail_on]]
    return _finish(args, report, failing, print_llamacpp_table)


def print_llamacpp_table(report, file=None) -> None:
    """One row per phase: max |Δ log p| (whole vocabulary) and top-1 agreement against float32 recomputation and
    against llama.cpp's own prefill, tokens served from the prompt cache, which comparison judged, the verdict."""
    out = file or sys.stdout
    head = (
        f"{'phase':<21} {'req':>4} {'pos':>5} {'Δlogp f32':>10} {'top-1 f32':>9} {'Δlogp self':>10} "
        f"{'top-1 self':>10} {'cached':>9} {'judged on':>10} {'verdict':>10}"
    )
    print(f"{report.phases[0].dtype if report.phases else ''}: {report.model}", file=out)
    print(head, file=out)
    print("-" * len(head), file=out)
    for p in report.phases:
        agree = "—" if p.top1_agreement is None else f"{p.top1_agreement:.4f}"
        self_agree = "—" if p.self_top1_agreement is None else f"{p.self_top1_agreement:.4f}"
        judged = _judged(p)
        print(
            f"{p.phase:<21} {p.requests:>4} {p.positions:>5} {_fmt(p.max_abs_dlogp):>10} {agree:>9} "
            f"{_fmt(p.self_max_abs_dlogp):>10} {self_agree:>10} {_cached(p):>9} {judged:>10} {p.verdict:>10}",
            file=out,
        )
        if p.note:
            print(f"{'':<22}note: {p.note}", file=out)
    th = report.thresholds
    print(
        "Δlogp: max |Δ log p| over the whole vocabulary at every position; f32: float32 recomputation of "
        f"{report.reference}; self: llama.cpp's own one-call prefill of the same tokens (context_shift: full "
        "recomputation of the kept tokens, which a shift does not do; never judged). judged on f32 when the arithmetic "
        f"is exact (F32 weights, --kv-type f32): < {th.noise:g} pass, < {th.suspicious:g} small, ≤ {th.bug:g} "
        f"suspicious, > {th.bug:g} bug, a differing top-1 token at least suspicious. Otherwise (quantized activations, "
        "F16 K/V) on the gap ratio: the phase's mean |Δ log p| to f32 over the prefill's, ≤ 2 pass, ≤ 5 suspicious, "
        "more a bug. Serving more cached tokens than the prompts share is a bug.",
        file=out,
    )


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


def _judged(p) -> str:
    """What decided the verdict: float32 recomputation, or the gap ratio of a reduced-precision deployment."""
    return "f32" if p.judged_on == "reference" else "gap" if p.gap_ratio is None else f"gap {p.gap_ratio:.2f}×"


def print_table(report, file=None) -> None:
    """One row per (dtype, phase): max |Δ log p| over the top-k and top-1 agreement against float32, first
    divergence, prefix-cache use, what judged the phase and the verdict."""
    out = file or sys.stdout
    head = (
        f"{'dtype':<9} {'phase':<16} {'req':>4} {'pos':>5} {'max |Δlogp|':>12} {'top-1 agree':>11} "
        f"{'first divergence':>26} {'cached':>9} {'chunks':>6} {'judged on':>11} {'verdict':>10}"
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
            f"{_judged(p):>11} {p.verdict:>10}",
            file=out,
        )
        if p.note:
            print(f"{'':<27}note: {p.note}", file=out)
    th = report.thresholds
    print("cached: prompt tokens served from the prefix cache (/ tokens shared with the cached request)", file=out)
    print(
        f"Δ log p and top-1: against float32 recomputation of {report.reference}, over vLLM's top-{report.top_k}. "
        f"float32 deployments (judged on f32) on verify-cache's scale: < {th.noise:g} pass, < {th.suspicious:g} "
        f"small, ≤ {th.bug:g} suspicious, > {th.bug:g} bug, a differing top-1 token at least suspicious. Reduced "
        "precision (judged on its gap ratio): each request's mean |Δ log p| to float32 over the same model's, "
        "recomputed honestly in that dtype; ≤ 2 pass, ≤ 5 suspicious, more a bug.",
        file=out,
    )
