"""``genprobe verify-serving URL --reference MODEL``: a live OpenAI-compatible server against float32 recomputation
(the flags, the run and the table; the phases are :mod:`genprobe.serving.live_verify`'s)."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

from ._common import info, out_dir, read_prompts


def add_live_arguments(p: argparse.ArgumentParser) -> None:
    """The endpoint's flags (``--backend endpoint``, the default for a URL)."""
    g = p.add_argument_group("a live endpoint (MODEL is a URL: --backend endpoint)")
    g.add_argument("--requests", type=int, default=64, help="greedy requests, alone and concurrent (default 64)")
    g.add_argument("--concurrency", type=int, default=8, help="requests in flight in the concurrency phase (default 8)")
    g.add_argument("--timeout", type=float, default=60.0, help="seconds one HTTP request may take (default 60)")
    g.add_argument("--retries", type=int, default=2, help="retries after a refused connection, a timeout or a 5xx")


def _check(args: argparse.Namespace) -> None:
    if not args.reference:
        raise ValueError("give --reference MODEL: the weights the server should serve (what it is compared with)")
    if args.requests < 8 or args.concurrency < 1 or args.max_new_tokens < 1:
        raise ValueError(
            f"--requests must be >= 8, --concurrency >= 1 and --max-new-tokens >= 1, got {args.requests}, "
            f"{args.concurrency}, {args.max_new_tokens}"
        )
    if not 1 <= args.top_k <= 20:
        raise ValueError(f"--top-k must be in [1, 20] (the OpenAI API's limit), got {args.top_k}")
    if args.timeout <= 0 or args.retries < 0:
        raise ValueError(f"--timeout must be > 0 and --retries >= 0, got {args.timeout}, {args.retries}")


def run_endpoint(args: argparse.Namespace, th: Any, finish: Callable[..., int], fail_on: tuple[str, ...]) -> int:
    """Every live phase; exit 1 when a phase reaches --fail-on, 2 on bad input (an unusable server included)."""
    import torch

    from ..model.load import load_model
    from ..serving.endpoint import EndpointBackend, HttpSettings
    from ..serving.live import LiveSettings, piece_table
    from ..serving.live_verify import verify_live

    _check(args)
    if args.out is not None:
        out_dir(args.out, "verify-serving.json")
    reference = load_model(args.reference, dtype=torch.float32)
    http = HttpSettings(timeout_s=args.timeout, retries=args.retries)
    backend = EndpointBackend(args.model, http, pieces=piece_table(reference))
    info(f"{args.model}: {backend.capabilities.server} server, model {backend.model_name!r}", args.json)
    settings = LiveSettings(args.requests, args.concurrency, args.max_new_tokens, args.top_k, args.seed)
    report = verify_live(
        backend, reference, args.reference, settings, read_prompts(args), th, lambda m: info(m, args.json), args.model
    )
    failing = [p.phase for p in report.phases if p.verdict in fail_on]
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    return finish(args, report, failing, print_live_table)


def _fmt(x: float | None, spec: str = ".3g") -> str:
    return "—" if x is None else format(x, spec)


def print_live_table(report: Any, file: Any = None) -> None:
    """One row per phase: what was compared, the figures, what judged it, the verdict; then what was not checked."""
    out = file or sys.stdout
    print(f"{report.url}: {report.server} server, model {report.model_name!r}, reference {report.reference}", file=out)
    head = (
        f"{'phase':<12} {'req':>4} {'pos':>5} {'max |Δlogp|':>11} {'top-1':>7} {'top-k':>7} {'gap':>8} "
        f"{'diverged':>9} {'judged on':>9} {'verdict':>11}"
    )
    print(head, file=out)
    print("-" * len(head), file=out)
    for p in report.phases:
        ratio = "—" if p.gap_ratio is None else f"{p.gap_ratio:.2f}×"
        print(
            f"{p.phase:<12} {p.requests:>4} {p.positions:>5} {_fmt(p.max_abs_dlogp):>11} "
            f"{_fmt(p.top1_agreement, '.4f'):>7} {_fmt(p.topk_agreement, '.3f'):>7} {ratio:>8} "
            f"{_fmt(p.divergence_rate, '.3f'):>9} {p.judged_on or '—':>9} {p.verdict:>11}",
            file=out,
        )
        if p.note:
            print(f"{'':<13}{p.note}", file=out)
    print(
        "Δ log p, top-1 and top-k (mean share of the served top-k in the reference's): against float32 "
        f"recomputation of {report.reference} over the ids the server returned. f32: < 1e-4 pass, ≤ 1 suspicious, "
        "> 1 bug, a differing top-1 token at least suspicious. gap: the phase's mean |Δ log p| over the same server's "
        "lone greedy requests (≤ 2 pass, ≤ 5 suspicious, more a bug); diverged: share of requests whose greedy "
        "tokens differ from their lone run.",
        file=out,
    )
