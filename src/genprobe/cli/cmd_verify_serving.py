"""Check a deployment's log-probabilities (vLLM, llama.cpp, a live server) against float32 recomputation
(batching, prefix cache, chunked prefill, precision).

Serve MODEL (vLLM once per --dtypes entry, the engine sized to the checks; or llama.cpp with --backend llama.cpp) or
reach the live OpenAI-compatible server at URL, and compare its prompt and per-step log-probabilities (greedy) with
float32 recomputation of the same tokens, phase by phase; a phase the backend cannot support is 'not checked'.
Float32 arithmetic is judged on verify-cache's scale over max |Δ log p|, reduced precision on its gap ratio over an
honest computation in that precision. Exit status as verify-cache: 0 when no phase reaches --fail-on, 1 when one
does, 2 on bad input (or when the engine is not installed, cannot start, or the server cannot be used).
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
from ..verify.compare import VERDICTS, at_least
from ._common import (
    Column,
    Command,
    add_max_new_tokens,
    add_prompt_arguments,
    check_min,
    emit_json,
    fmt,
    info,
    option,
    out_dir,
    read_prompts,
    table,
    thresholds_of,
    write_out,
)
from ._vllm_args import (
    add_engine_arguments,
    add_http_arguments,
    add_kv_type,
    endpoint_backend,
    engine_options,
    require_engine,
)

KINDS = {"vllm": ("checkpoint", "transformers", "name"), "llama.cpp": ("gguf", "name"), "endpoint": ("url",)}


def options(p: argparse.ArgumentParser) -> None:
    backend = (
        "vllm (default for a model on disk: served by vLLM once per --dtypes entry), llama.cpp (MODEL a GGUF file or "
        "a fetched name) or endpoint (default for a URL: a live OpenAI-compatible server checked against --reference; "
        "docs/live-serving.md)"
    )
    option(p, "--backend", choices=tuple(KINDS), help=backend)
    option(p, "--reference", metavar="MODEL", help="the weights the deployment should serve (default: MODEL itself)")
    dtypes = ("float32", "bfloat16", "float16")
    option(p, "--dtypes", ["float32", "bfloat16"], "deployment dtypes, one engine each", choices=dtypes)
    add_max_new_tokens(p, 16)
    option(p, "--top-k", 5, "log-probabilities compared per position")
    add_prompt_arguments(p, help_default=" (default: seeded random token ids)")
    option(p, "--seed", 0, "seed of the random prompts")
    add_engine_arguments(p, size=32)
    g = p.add_argument_group("llama.cpp (with --backend llama.cpp)")
    option(g, "--threads", 1, "llama.cpp and torch CPU threads")
    add_kv_type(g, "f16")
    option(g, "--n-ctx", 256, "context length (rounded up to 256 as llama.cpp does)")
    option(g, "--n-keep", 4, "tokens the context shift keeps at the start")
    g = p.add_argument_group("a live endpoint (MODEL is a URL: --backend endpoint)")
    option(g, "--requests", 64, "greedy requests, alone and concurrent")
    add_http_arguments(g, " in the batch phase")
    option(g, "--retries", 2, "retries after a refused connection, a timeout or a 5xx")
    option(p, "--noise", 1e-4, "float-noise threshold on |Δ log p|")
    option(p, "--bug", 1.0, "bug threshold on max |Δ log p|")
    option(p, "--fail-on", "bug", "lowest phase verdict that makes the exit status 1", choices=VERDICTS[1:])
    option(p, "--out", type=Path, metavar="DIR", help="write verify-serving.json and the engine's log (engine.log)")
    option(p, "--verbose", False, "let the engine's log lines reach the terminal instead of a log file")


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


def run(args: argparse.Namespace) -> int:
    """Every phase on the chosen backend, the table, --json and --out; exit 1 when a phase reaches --fail-on, 2 when
    the engine is not installed."""
    import torch

    th = thresholds_of(args)
    if args.backend == "endpoint":  # every phase on the server at URL against --reference
        from ..serving.verify import Settings, verify_backend

        check_min(args, requests=8, max_new_tokens=1, retries=0)
        if not 1 <= args.top_k <= 20:
            raise ValueError(f"--top-k must be in [1, 20] (the OpenAI API's limit), got {args.top_k}")
        if args.out is not None:
            out_dir(args.out, "verify-serving.json")  # checked now, made once there is a result
        backend, reference = endpoint_backend(args, dtype=torch.float32)
        settings = Settings(args.requests, args.concurrency, args.max_new_tokens, args.top_k, args.seed)
        say = lambda m: info(m, args.json)  # noqa: E731
        report = verify_backend(backend, reference, args.reference, settings, read_prompts(args), th, say, args.model)
    else:
        from ..model.load import load_model

        if args.backend == "llama.cpp":
            check_min(args, threads=1)
        prompts: list[list[int]] = []
        if texts := read_prompts(args):
            m = load_model(args.reference or args.model)
            prompts = [m.encode(t) for t in texts]
        with engine_log(args) as say:  # importing an engine prints too (vLLM: Triton, deprecations): into the log
            require_engine(args.backend)
            common = {"prompts": prompts, "steps": args.max_new_tokens, "thresholds": th, "seed": args.seed, "log": say}
            if args.backend == "llama.cpp":  # llama.cpp serving the GGUF file
                from ..serving.llamacpp.scan import gguf_file_for
                from ..serving.llamacpp.verify import verify_serving_llamacpp

                torch.set_num_threads(args.threads)
                file, reference = gguf_file_for(args.model), args.reference or args.model
                engine = {k: getattr(args, k) for k in ("n_ctx", "kv_type", "n_keep")} | {"n_threads": args.threads}
                report = verify_serving_llamacpp(file, reference, **engine, **common)
            else:  # vLLM serving MODEL once per --dtypes entry
                from ..serving.verify import verify_serving

                options = engine_options(args, seed=args.seed)
                common |= {"dtypes": args.dtypes, "options": options, "top_k": args.top_k}
                report = verify_serving(args.model, args.reference, **common)
    bad = [p for p in report.phases if at_least(p.verdict, args.fail_on)]
    failing = [f"{p.dtype}/{p.phase}" if p.dtype else p.phase for p in bad]
    rc = 1 if failing else 0
    print_table(report, sys.stderr if args.json else sys.stdout)
    if failing:
        info(f"FAIL: {', '.join(failing)}")
    summary = {**json_safe(report), "failing": failing, "exit_status": rc}
    write_out(args, "verify-serving.json", summary)
    if args.json:
        emit_json(summary)
    return rc


def _judged(p: Any) -> str:
    """What decided the verdict: float32 recomputation, the gap ratio over a floor, tokens or the template."""
    if p.judged_on == "gap":
        return "gap" if p.gap_ratio is None else f"gap {p.gap_ratio:.2f}×"
    return {"reference": "f32", "": "—"}.get(p.judged_on, p.judged_on)


PHASES: tuple[Column, ...] = (
    ("deployment", -12, lambda p: p.dtype or "—"),
    ("phase", -17, lambda p: p.phase),
    ("req", 4, lambda p: p.requests),
    ("pos", 5, lambda p: p.positions),
    ("Δlogp f32", 10, lambda p: fmt(p.max_abs_dlogp)),
    ("top-1 f32", 9, lambda p: fmt(p.top1_agreement, ".4f")),
    ("Δlogp self", 10, lambda p: fmt(p.self_max_abs_dlogp)),
    ("top-k", 6, lambda p: fmt(p.topk_agreement, ".3f")),
    ("cached", 9, lambda p: fmt(p.cached_tokens, "d") + ("" if p.shared_tokens is None else f"/{p.shared_tokens}")),
    ("judged on", 10, _judged),
    ("verdict", 11, lambda p: p.verdict),
)


def print_table(report: Any, out: Any) -> None:
    """One row per (deployment, phase): max |Δ log p| and top-1 agreement against float32 recomputation and against
    the deployment's own honest computation, top-k overlap, prefix-cache use, what judged it and the verdict."""
    name = f", model {report.model_name!r}" if report.model_name else ""
    print(f"{report.model}: {report.server} server{name}, reference {report.reference}", file=out)
    lines = table(PHASES, report.phases, rule=True).splitlines()
    print("\n".join(lines[:2]), file=out)
    for line, p in zip(lines[2:], report.phases, strict=True):
        print(line + (f"\n{'':<13}note: {p.note}" if p.note else ""), file=out)
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


COMMANDS = (Command("verify-serving", __doc__, run, options, model=KINDS),)
