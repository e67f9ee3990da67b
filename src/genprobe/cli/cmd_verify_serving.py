"""``genprobe verify-serving MODEL|URL``: does a serving deployment compute the model's log-probabilities?

One verifier (:mod:`genprobe.serving.verify`) on one backend: vLLM serving MODEL in process (once per ``--dtypes``
entry), llama.cpp serving a GGUF file (``--backend llama.cpp``), or a live OpenAI-compatible server at URL
(``--reference`` the weights it should serve). Every phase the backend allows compares the returned log-probabilities
with float32 recomputation; the others say why they were not checked. Exit status as verify-cache: 0 when no phase
reaches ``--fail-on`` (default bug), 1 when one does, 2 on bad input (or when the engine is not installed, cannot
start, or the server cannot be used: one line naming the problem).

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
from typing import Any, Callable, Iterator

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
from ._vllm_args import add_engine_arguments, engine_options

FAIL_ON = {"bug": ("bug",), "suspicious": ("suspicious", "bug"), "small": ("small", "suspicious", "bug")}


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``verify-serving`` sub-command."""
    p = sub.add_parser(
        "verify-serving",
        help="check a deployment's log-probabilities (vLLM, llama.cpp, a live server) against float32 recomputation "
        "(batching, prefix cache, chunked prefill, precision)",
        description="Serve MODEL (vLLM, or llama.cpp with --backend llama.cpp) or reach the server at URL and compare "
        "its prompt and per-step log-probabilities (greedy) with float32 recomputation of the same tokens, phase by "
        "phase: prompt, greedy, batch, prefix (cache), prefix_uncached, diverge_boundary, diverge_inside, "
        "chunked_prefill, seed, limits, chat (and llama.cpp's context_shift); a phase the backend cannot support is "
        "'not checked'. Float32 arithmetic is judged on verify-cache's scale over max |Δ log p| (a differing top-1 "
        "token is at least 'suspicious'), reduced precision on its gap ratio over an honest computation in that "
        "precision. vLLM's context and KV cache are sized to these checks unless --max-model-len / "
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
        help="vllm (the default for a model on disk: the model directory served by vLLM, once per --dtypes entry), "
        "llama.cpp (MODEL is a GGUF file, or a catalog name whose GGUF `genprobe fetch` kept: every position's logits "
        "against float32 recomputation of the same weights dequantized and against llama.cpp's own prefill) or "
        "endpoint (the default for a URL: a live OpenAI-compatible server — vLLM, llama-cpp-python's server, any "
        "other — checked against --reference; docs/live-serving.md)",
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
    _add_live_arguments(p)
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


def _finish(args: argparse.Namespace, report: Any) -> int:
    """The table, the failing phases, --json and --out; the exit status."""
    from .._io import atomic_write_json

    bad = [p for p in report.phases if p.verdict in FAIL_ON[args.fail_on]]
    failing = [f"{p.dtype}/{p.phase}" if p.dtype else p.phase for p in bad]
    rc = 1 if failing else 0
    print_table(report, file=sys.stderr if args.json else sys.stdout)
    if failing:
        info(f"FAIL: {', '.join(failing)}")
    summary = {**json_safe(report), "failing": failing, "exit_status": rc}
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(args.out / "verify-serving.json", summary)
    if args.json:
        emit_json(summary)
    return rc


def run(args: argparse.Namespace) -> int:
    """Every phase on the chosen backend, the table; exit 1 when a phase reaches --fail-on, 2 when the engine is not
    installed."""
    from ..serving._vllm import vllm_import_problem
    from ..serving.llamacpp import llama_cpp_problem
    from ..verify.compare import Thresholds

    th = Thresholds(noise=args.noise, bug=args.bug, suspicious=max(args.noise, min(1e-3, args.bug)))
    if args.backend == "endpoint":
        return _finish(args, run_endpoint(args, th))
    if args.backend == "llama.cpp" and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    common = {"prompts": _encode_prompts(args), "steps": args.max_new_tokens, "thresholds": th, "seed": args.seed}
    with engine_log(args) as say:  # importing an engine prints too (vLLM: Triton, deprecations): into the log
        llama = args.backend == "llama.cpp"
        problem = llama_cpp_problem() if llama else vllm_import_problem()
        report = None if problem else (run_llamacpp if llama else run_vllm)(args, {**common, "log": say})
    if report is None:
        print(f"genprobe verify-serving: error: {problem}", file=sys.stderr)
        return 2
    return _finish(args, report)


def run_vllm(args: argparse.Namespace, common: dict[str, Any]) -> Any:
    """vLLM serving MODEL once per ``--dtypes`` entry (``common``: the settings every engine takes)."""
    from ..serving.verify import verify_serving

    options = _options(args)
    return verify_serving(args.model, args.reference, dtypes=args.dtypes, options=options, top_k=args.top_k, **common)


def run_llamacpp(args: argparse.Namespace, common: dict[str, Any]) -> Any:
    """llama.cpp serving the GGUF file."""
    import torch

    from ..serving.llamacpp.scan import gguf_file_for
    from ..serving.llamacpp.verify import verify_serving_llamacpp

    torch.set_num_threads(args.threads)
    file, reference = gguf_file_for(args.model), args.reference or args.model
    engine = {"n_ctx": args.n_ctx, "n_threads": args.threads, "kv_type": args.kv_type, "n_keep": args.n_keep}
    return verify_serving_llamacpp(file, reference, **engine, **common)


def _add_live_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("a live endpoint (MODEL is a URL: --backend endpoint)")
    g.add_argument("--requests", type=int, default=64, help="greedy requests, alone and concurrent (default 64)")
    g.add_argument("--concurrency", type=int, default=8, help="requests in flight in the batch phase (default 8)")
    g.add_argument("--timeout", type=float, default=60.0, help="seconds one HTTP request may take (default 60)")
    g.add_argument("--retries", type=int, default=2, help="retries after a refused connection, a timeout or a 5xx")


def run_endpoint(args: argparse.Namespace, th: Any) -> Any:
    """``--backend endpoint``: every phase on the server at URL against ``--reference``."""
    import torch

    from ..model.load import load_model
    from ..serving.endpoint import EndpointBackend, HttpSettings, piece_table
    from ..serving.verify import Settings, verify_backend

    if not args.reference:
        raise ValueError("give --reference MODEL: the weights the server should serve (what it is compared with)")
    if args.requests < 8 or args.concurrency < 1 or args.max_new_tokens < 1:
        raise ValueError(
            f"--requests must be >= 8, --concurrency >= 1 and --max-new-tokens >= 1, got {args.requests}, "
            f"{args.concurrency}, {args.max_new_tokens}"
        )
    if not 1 <= args.top_k <= 20:
        raise ValueError(f"--top-k must be in [1, 20] (the OpenAI API's limit), got {args.top_k}")
    if args.out is not None:
        out_dir(args.out, "verify-serving.json")  # checked now, made once there is a result
    reference = load_model(args.reference, dtype=torch.float32)
    http = HttpSettings(timeout_s=args.timeout, retries=args.retries)
    backend = EndpointBackend(args.model, http, pieces=piece_table(reference))
    info(f"{args.model}: {backend.capabilities.server} server, model {backend.model_name!r}", args.json)
    settings = Settings(args.requests, args.concurrency, args.max_new_tokens, args.top_k, args.seed)
    say = lambda m: info(m, args.json)  # noqa: E731
    return verify_backend(backend, reference, args.reference, settings, read_prompts(args), th, say, args.model)


def _fmt(x: float | None, spec: str = ".3g") -> str:
    return "—" if x is None else format(x, spec)


def _cached(p: Any) -> str:
    """Prompt tokens served from the prefix cache, over the tokens shared with the cached request when known."""
    c = _fmt(p.cached_tokens, "d")
    return c if p.shared_tokens is None else f"{c}/{p.shared_tokens}"


def _judged(p: Any) -> str:
    """What decided the verdict: float32 recomputation, the gap ratio over a floor, tokens or the template."""
    if p.judged_on == "gap":
        return "gap" if p.gap_ratio is None else f"gap {p.gap_ratio:.2f}×"
    return {"reference": "f32", "": "—"}.get(p.judged_on, p.judged_on)


def print_table(report: Any, file: Any = None) -> None:
    """One row per (deployment, phase): max |Δ log p| and top-1 agreement against float32 recomputation and against
    the deployment's own honest computation, top-k overlap, prefix-cache use, what judged it and the verdict."""
    out = file or sys.stdout
    name = f", model {report.model_name!r}" if report.model_name else ""
    print(f"{report.model}: {report.server} server{name}, reference {report.reference}", file=out)
    head = (
        f"{'deployment':<12} {'phase':<17} {'req':>4} {'pos':>5} {'Δlogp f32':>10} {'top-1 f32':>9} "
        f"{'Δlogp self':>10} {'top-k':>6} {'cached':>9} {'judged on':>10} {'verdict':>11}"
    )
    print(head, file=out)
    print("-" * len(head), file=out)
    for p in report.phases:
        print(
            f"{p.dtype or '—':<12} {p.phase:<17} {p.requests:>4} {p.positions:>5} {_fmt(p.max_abs_dlogp):>10} "
            f"{_fmt(p.top1_agreement, '.4f'):>9} {_fmt(p.self_max_abs_dlogp):>10} {_fmt(p.topk_agreement, '.3f'):>6} "
            f"{_cached(p):>9} {_judged(p):>10} {p.verdict:>11}",
            file=out,
        )
        if p.note:
            print(f"{'':<13}note: {p.note}", file=out)
    th = report.thresholds
    print(
        f"Δlogp f32, top-1 f32: max |Δ log p| and top-1 agreement against float32 recomputation of {report.reference} "
        "over the ids the backend returned (the whole vocabulary where it returns every row); self: against the "
        "deployment's own honest computation (llama.cpp's one-call prefill, or the model recomputed in the reduced "
        "dtype; context_shift: full recomputation of the kept tokens, which a shift does not do; never judged); "
        "top-k: mean share of the served top-k in the reference's. judged on f32 (exact float32 arithmetic, and a "
        f"live server's prompt and lone requests): < {th.noise:g} pass, < {th.suspicious:g} small, ≤ {th.bug:g} "
        f"suspicious, > {th.bug:g} bug, a differing top-1 token at least suspicious. gap R×: each request's mean "
        "|Δ log p| to f32 over its floor (the honest computation's, or the lone requests'); ≤ 2 pass, ≤ 5 "
        "suspicious, more a bug. cached: prompt tokens served from a prefix cache / tokens shared with the cached "
        "prompt; serving more is a bug.",
        file=out,
    )
