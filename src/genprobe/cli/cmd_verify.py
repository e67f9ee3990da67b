"""``genprobe verify-cache``: is a KV-cache implementation equivalent to full recomputation?

Compares logits step by step (prefill, greedy decode, chunked prefill, left-padded batch, isolation
across ``reset()``, prefix reuse across sequences) and prints the chapter §3.9.8-style table plus each
phase's max |Δlogit| and first differing step. Verdicts are judged against the reference's own float
noise on the model at hand (its noise floor, measured first; a difference below ``--floor-multiple``
times it passes). The exit status (:data:`EPILOG`) is usable in another project's CI; ``--json`` output is
strict JSON (non-finite numbers spelled ``"nan"``/``"inf"``).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any, Callable

from ._common import (
    Accumulate,
    add_json_flag,
    add_max_new_tokens,
    add_model_argument,
    add_prompt_arguments,
    add_weight_dtype,
    emit_json,
    info,
    load_model_arg,
    model_path,
    read_prompts,
)

if TYPE_CHECKING:  # pragma: no cover
    from ..model.load import Model
    from ..verify.api import CacheVerification
    from ..verify.compare import Thresholds

# genprobe.verify.api.FAIL_ON's keys, spelled out so that building the parser does not import torch
FAIL_ON = ("bug", "small", "suspicious")
EXIT_PASS, EXIT_BUG, EXIT_USAGE, EXIT_IMPL_ERROR = 0, 1, 2, 3
# genprobe.verify.hf_caches.CACHE_KINDS, spelled out so that building the parser does not import torch
HF_CACHE_KINDS = ("dynamic", "static", "sliding", "quantized", "offloaded")

EPILOG = """\
exit status: 0 every implementation within --fail-on; 1 one judged a bug (or a mutant not caught, or cat_order
flagged); 2 bad input or usage; 3 an implementation raised (verdict error: phase, exception type and message in the
table and the JSON; takes precedence over 1). --json is written in every case but 2.

sliding windows: --window W [--sinks S] makes the reference full recomputation under a sliding window
(a query at position q sees keys at q-W+1..q, plus positions 0..S-1 when S sinks are kept) and runs our
engine with a ring-buffer KVCache of S+W slots. A correct windowed cache then passes; one that evicts
in the wrong order (e.g. drops the sinks first) fails. Applies to genprobe models and to --impl with a
genprobe MODEL (your factory must build its cache with the same W and S). A transformers model's window
comes from its config (sliding_window), which both its reference and its caches follow.

transformers caches: --hf-cache dynamic static sliding quantized offloaded (or all) verifies each of the
model's own cache classes (a fresh cache per sequence); kinds this transformers version or machine lacks are
reported as unavailable with the reason. quantized is lossy by design: expect suspicious or bug.

prefix reuse: sequences of 48 tokens (fewer in a shorter context) sharing 1, 4, 7, 8, 13, 15, 16, 24, 31, 32
leading tokens with a base sequence, one token changed at the last position of a block of 8/16/32, the first 16
tokens replaced, the base again, and its first 32 / 20 tokens then others (prompts shorter than a cached one);
run with reset() between them, and back to back when the implementation sets prefill_starts_sequence = True.
The report lists the situations exercised.

noise floor: the reference computes the same logits twice in another order (a padded batch's rows vs each
row alone; a prefix's positions in a forward over the prefix vs over the whole sequence). The largest
difference is the floor; a phase passes below max(--noise, --floor-multiple x floor), at most 0.1 x --bug.
"""


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``verify-cache`` sub-command."""
    p = sub.add_parser(
        "verify-cache",
        help="check that a KV-cache implementation is equivalent to recomputation (logits, not text)",
        description="Verify a cached implementation against full recomputation, step by step: prefill\n"
        "(bit-identical?), N greedy decode steps, chunked prefill, a left-padded batch, and isolation (another\n"
        "sequence, reset(), then the prompt: nothing may survive reset). MODEL alone verifies its own cache\n"
        "(our engine for a genprobe checkpoint, transformers' caches for a transformers directory); with\n"
        "--impl MOD:FACTORY it verifies your adapter (reset(), prefill(ids, attention_mask=None), step(ids))\n"
        "built by factory(MODEL), with MODEL as the reference.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # the groups in the order --help lists them
    _add_target_arguments(p)
    _add_run_arguments(p)
    _add_threshold_arguments(p)
    add_json_flag(p)
    p.set_defaults(func=run)


def _add_target_arguments(p: argparse.ArgumentParser) -> None:
    """What to verify: MODEL, --impl, --compiled, the weights' dtype, --mutants."""
    add_model_argument(p, required=False)
    p.add_argument("--impl", metavar="MOD:FACTORY", help="your implementation: factory(model) or factory()")
    p.add_argument(
        "--compiled",
        action="store_true",
        help="genprobe MODEL: also verify the torch.compile'd decode path (StaticKVCache; the first run compiles, "
        "~30 s)",
    )
    add_weight_dtype(p)
    p.add_argument("--mutants", action="store_true", help="also run the planted-bug mutants (genprobe or GPT-2 models)")


def _add_run_arguments(p: argparse.ArgumentParser) -> None:
    """How to run it: steps, prompts, chunk sizes, window, transformers caches, phases to skip."""
    add_max_new_tokens(p, 50)
    add_prompt_arguments(
        p, help_default=" (default: two Tang openings for a genprobe checkpoint, random ids otherwise)"
    )
    p.add_argument(
        "--chunk-sizes",
        nargs="+",
        action=Accumulate,
        default=["1", "4"],
        metavar="C",
        help="chunk sizes of the chunked-prefill phases (default 1 4)",
    )
    p.add_argument(
        "--window", type=int, metavar="W", help="sliding window of the reference (and of our engine's cache)"
    )
    p.add_argument("--sinks", type=int, default=0, metavar="S", help="attention sinks kept with --window (default 0)")
    p.add_argument(
        "--hf-cache",
        nargs="+",
        action=Accumulate,
        metavar="KIND",
        choices=(*HF_CACHE_KINDS, "all"),
        help="transformers MODEL: verify these cache classes: " + " ".join(HF_CACHE_KINDS) + ", or all",
    )
    p.add_argument("--no-padded-batch", action="store_true", help="skip the left-padded batch comparison")
    p.add_argument("--no-isolation", action="store_true", help="skip the isolation (state surviving reset) comparison")
    p.add_argument(
        "--no-prefix-reuse", action="store_true", help="skip the prefix-reuse phases (sequences sharing prefixes)"
    )
    p.add_argument(
        "--hf-no-position-ids",
        action="store_true",
        help="drive the transformers model without position_ids (reproduces the left-padding position bug class)",
    )


def _add_threshold_arguments(p: argparse.ArgumentParser) -> None:
    """How to judge it: the verdict thresholds and the lowest verdict that fails the run."""
    p.add_argument("--noise", type=float, default=1e-4, help="float-noise threshold on max |Δlogit| (default 1e-4)")
    p.add_argument(
        "--floor-multiple",
        type=float,
        default=4.0,
        help="a difference below this many times the reference's own noise floor passes (default 4; 0: ignore it)",
    )
    p.add_argument("--bug", type=float, default=1.0, help="bug threshold on max |Δlogit| (default 1.0)")
    p.add_argument(
        "--rel-bug",
        type=float,
        default=1.0,
        help="bug threshold in standard deviations of the reference logits (default 1.0)",
    )
    p.add_argument(
        "--fail-on",
        choices=sorted(FAIL_ON),
        default="bug",
        help="lowest verdict of an implementation under test that makes the exit status 1 (default bug)",
    )


# ---- the command ---------------------------------------------------------------------------------------
def chunk_sizes(values: list[str]) -> list[int]:
    """``--chunk-sizes 1 4`` as integers (the harness refuses one below 1)."""
    try:
        return [int(v) for v in values]
    except ValueError:
        raise ValueError(f"--chunk-sizes expects integers, got {' '.join(values)!r}") from None


def run(args: argparse.Namespace) -> int:
    """Parse, call :func:`genprobe.verify_caches` (which refuses what does not apply), print the tables; exit
    0/1/3 (2 via ValueError)."""
    from ..verify.api import verify_caches

    model = _load_model(args)
    if args.impl and os.getcwd() not in sys.path:  # the user's project, as `python -m` would see it
        sys.path.insert(0, os.getcwd())
    result = verify_caches(
        model,
        args.impl,
        compiled=args.compiled,
        hf_caches=args.hf_cache or (),
        mutants=args.mutants,
        prompts=read_prompts(args),
        max_new_tokens=args.max_new_tokens,
        chunk_sizes=chunk_sizes(args.chunk_sizes),
        window=args.window,
        sinks=args.sinks,
        hf_position_ids=not args.hf_no_position_ids,
        padded_batch=not args.no_padded_batch,
        isolation=not args.no_isolation,
        prefix_reuse=not args.no_prefix_reuse,
        thresholds=_thresholds(args),
        log=info,
    )
    failing, errored = result.failing(args.fail_on), result.errors
    rc = EXIT_IMPL_ERROR if errored else EXIT_BUG if failing else EXIT_PASS
    print_tables(result, file=sys.stderr if args.json else sys.stdout)
    if errored:
        info(f"ERROR: {', '.join(errored)} raised (exit status {EXIT_IMPL_ERROR})")
    if failing:
        info(f"FAIL: {', '.join(failing)}")
    if args.json:
        dtype = {"weight_dtype": args.weight_dtype, "narrow_output": args.narrow_output}
        emit_json(result.to_dict(args.fail_on) | dtype | {"exit_status": rc})
    return rc


def _load_model(args: argparse.Namespace) -> "Model | None":
    """MODEL loaded (None when not given), saying when its linear layers are stored in a narrower dtype."""
    path = model_path(args, required=False)
    model = None
    if path is not None:
        model = load_model_arg(args, path)
        if args.weight_dtype != "float32":
            head = ", the output layer too" if args.narrow_output else ""
            info(
                f"weights: linear layers stored in {args.weight_dtype}{head} (weight-only): the verdict is that model's"
            )
    return model


def _thresholds(args: argparse.Namespace) -> "Thresholds":
    """The verdict thresholds of --noise, --bug, --rel-bug and --floor-multiple (the in-between ones derived)."""
    from ..verify.compare import Thresholds

    return Thresholds(
        noise=args.noise,
        bug=args.bug,
        suspicious=max(args.noise, min(1e-3, args.bug)),
        rel_bug=args.rel_bug,
        rel_suspicious=min(0.01, args.rel_bug),
        floor_multiple=args.floor_multiple,
    )


# ---- tables --------------------------------------------------------------------------------------------
def _g(x: float | None, spec: str = ".3g") -> str:
    return "—" if x is None else format(x, spec)


def _yes(x: bool) -> str:
    return "yes" if x else "no"


SUMMARY: tuple[tuple[str, str, int, Callable[[Any], str]], ...] = (  # header (two lines), width (< 0: left), cell
    ("implementation", "", -30, lambda r: r.impl[:30]),
    ("verdict", "", 11, lambda r: r.verdict),
    ("prefill", "exact", 8, lambda r: _yes(r.prefill_bit_identical)),
    ("max |Δ|", "logit", 11, lambda r: _g(r.max_abs_dlogit, ".4g")),
    ("Δ/σ", "", 8, lambda r: _g(r.max_rel_dlogit)),
    ("margin", "", 7, lambda r: _g(r.bug_margin)),
    ("top-1", "agree", 7, lambda r: _g(r.min_top1_agreement, ".3f")),
    ("worst phase", "", 21, lambda r: str(r.worst_phase or "—")[:21]),
    ("text", "div.", 5, lambda r: str(r.text_divergences)),
    ("text", "only", 5, lambda r: _yes(r.text_only_would_catch)),
)


def _cells(cells: list[str], widths: list[int]) -> str:
    return " ".join(f"{c:<{-w}}" if w < 0 else f"{c:>{w}}" for c, w in zip(cells, widths, strict=True)).rstrip()


def _phase_cell(p) -> str:
    if p.error is not None:
        return "error"
    if not p.judged:
        return "skipped"
    cell = f"{p.max_abs_dlogit:.3g}"
    return cell if p.first_diff_step is None else f"{cell} @{p.first_diff_step}"


def print_tables(result: "CacheVerification", file=None) -> None:
    """The chapter §3.9.8 summary, then each phase's max |Δlogit| @ first differing call, then errors/unavailable."""
    out, th = file or sys.stdout, result.thresholds
    rows = result.mutants.rows if result.mutants is not None else []
    widths = [w for *_, w, _ in SUMMARY] + ([9, 3] if rows else [])
    heads = [(a, b) for a, b, *_ in SUMMARY] + ([("expected", ""), ("ok", "")] if rows else [])
    for i in (0, 1):
        print(_cells([h[i] for h in heads], widths), file=out)
    print("-" * (sum(map(abs, widths)) + len(widths) - 1), file=out)
    for i, r in enumerate(result.all_reports):
        row = rows[i - len(result.reports)] if i >= len(result.reports) else None
        extra = [row["expected"], "✓" if row["as_expected"] else "✗"] if row else []
        print(_cells([cell(r) for *_, cell in SUMMARY] + extra, widths[: len(SUMMARY) + len(extra)]), file=out)
    _print_floor_and_reuse(result, out)
    phases = list(dict.fromkeys(p.phase for r in result.all_reports for p in r.phases))
    if phases:
        print(
            "\nmax |Δlogit| per phase, @ first call above noise (0 = prefill call, k = k-th step or chunk):", file=out
        )
        print(f"{'implementation':<30} " + " ".join(f"{ph:>14}" for ph in phases), file=out)
        for r in result.all_reports:
            cells = {p.phase: _phase_cell(p) for p in r.phases}
            print(f"{r.impl[:30]:<30} " + " ".join(f"{cells.get(ph, '—'):>14}" for ph in phases), file=out)
    for r in result.reports:
        for e in r.errors:
            at = "" if e.call is None else f" at call {e.call}"
            print(f"error: {r.impl} raised in phase {e.phase}{at}: {e.type}: {e.message}", file=out)
        if r.unavailable:
            print(f"unavailable: {r.impl}: {r.unavailable}", file=out)
    print(
        f"verdict: the worse of max |Δlogit| (< {th.noise:g} pass, < {th.suspicious:g} small, ≤ {th.bug:g} suspicious, "
        f"> {th.bug:g} bug)\n"
        f"  and Δ/σ, |Δ| in standard deviations of the reference logits (> {th.rel_bug:g} bug, ≥ {th.rel_suspicious:g} "
        f"suspicious; only for |Δ| ≥ {th.noise:g}).\n"
        "margin: how far past the bug line (max of |Δ|/bug and (Δ/σ)/rel-bug; ≥ 1 is a bug).\n"
        "top-1 agree: lowest share of positions whose argmax matches the reference's, over phases. text div.: greedy\n"
        "  text positions that differ; text only: would comparing text alone have caught it. —: phase not run.",
        file=out,
    )
    if result.mutants is not None:
        parts = ", ".join(f"{k} = {v:.4g}" for k, v in result.mutants.mask_noop.items())
        print(f"mask no-op (no_mask vs correct on the same cached path): {parts}", file=out)


def _print_floor_and_reuse(result: "CacheVerification", out) -> None:
    """The reference's noise floor and the pass line it sets; the reuse situations; padded rows that disagree."""
    floor, th = result.noise_floor, result.thresholds
    if floor is not None:
        how = ", ".join(f"{k} {v:.3g}" for k, v in floor["sources"].items())
        print(
            f"\nnoise floor of the reference on this model: {floor['value']:.3g} ({how}); pass line "
            f"max({th.noise:g}, {th.floor_multiple:g} x floor) = {result.pass_line:.3g}",
            file=out,
        )
    reuse = next((r.reuse for r in result.all_reports if r.reuse), None)
    if reuse:
        print("prefix reuse exercised: " + "; ".join(reuse), file=out)
    for r in result.all_reports:
        for p in r.phases:
            bad = [row for row in p.per_row or [] if row["top1_disagreement"] > 0]
            if bad:
                cells = ", ".join(f"row of {x['prompt_length']} tokens {x['top1_disagreement']:.0%}" for x in bad)
                print(f"{r.impl}: padded rows whose top-1 differs from the prompt run alone: {cells}", file=out)
