"""Check that a KV-cache implementation is equivalent to recomputation (logits, not text).

Verify a cached implementation against full recomputation, step by step, on logits (not text): prefill
(bit-identical?), N greedy decode steps, chunked prefill, a left-padded batch, and isolation (another sequence,
reset(), then the prompt: nothing may survive reset). MODEL alone verifies its own cache (our engine for a genprobe
checkpoint, transformers' caches for a transformers directory); with --impl MOD:FACTORY it verifies your adapter
(reset(), prefill(ids, attention_mask=None), step(ids)) built by factory(MODEL), with MODEL as the reference. Prints
the chapter §3.9.8-style table plus each phase's max |Δlogit| and first differing step, judged against the
reference's own float noise (docs/verify-cache.md); --json output is strict JSON.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from ..verify.compare import VERDICTS  # these two import no torch: building the parser does not
from ..verify.hf_caches import CACHE_KINDS
from ._common import (
    MODEL_KINDS,
    Column,
    Command,
    add_max_new_tokens,
    add_prompt_arguments,
    add_weight_dtype,
    emit_json,
    fmt,
    info,
    integers,
    load_model_arg,
    option,
    read_prompts,
    table,
    thresholds_of,
    user_project_importable,
)

if TYPE_CHECKING:  # pragma: no cover
    from ..verify.api import CacheVerification

EXIT_PASS, EXIT_BUG, EXIT_USAGE, EXIT_IMPL_ERROR = 0, 1, 2, 3

EPILOG = """\
exit status: 0 every implementation within --fail-on; 1 one judged a bug (or a mutant not caught, or cat_order
flagged); 2 bad input or usage; 3 an implementation raised (verdict error: phase, exception type and message in the
table and the JSON; takes precedence over 1). --json is written in every case but 2.

--window W [--sinks S]: the reference is full recomputation under a sliding window (plus S sink positions) and our
engine runs a ring-buffer KVCache of S+W slots (your --impl factory must build its cache with the same W and S); a
transformers model's window comes from its config. --hf-cache verifies the model's own cache classes (quantized is
lossy by design). Prefix reuse: sequences sharing 1..32 leading tokens with a base, run with reset() between them.
Noise floor: the reference computes the same logits twice in another order; a phase passes below max(--noise,
--floor-multiple x floor), at most 0.1 x --bug. Details: docs/verify-cache.md.
"""


def options(p: argparse.ArgumentParser) -> None:
    """The options in the order --help lists them: what to verify, how to run it, how to judge it."""
    option(p, "--impl", metavar="MOD:FACTORY", help="your implementation: factory(model) or factory()")
    option(p, "--compiled", False, "genprobe MODEL: also verify the torch.compile'd decode path (compiles ~30 s)")
    add_weight_dtype(p)
    option(p, "--mutants", False, "also run the planted-bug mutants (genprobe or GPT-2 models)")
    add_max_new_tokens(p, 50)
    add_prompt_arguments(
        p, help_default=" (default: two Tang openings for a genprobe checkpoint, random ids otherwise)"
    )
    option(p, "--chunk-sizes", ["1", "4"], "chunk sizes of the chunked-prefill phases", metavar="C")
    option(p, "--window", type=int, metavar="W", help="sliding window of the reference (and of our engine's cache)")
    option(p, "--sinks", 0, "attention sinks kept with --window", metavar="S")
    kinds = (*CACHE_KINDS, "all")
    option(p, "--hf-cache", [], "transformers MODEL: verify these cache classes: " + " ".join(kinds), choices=kinds)
    option(p, "--no-padded-batch", False, "skip the left-padded batch comparison")
    option(p, "--no-isolation", False, "skip the isolation (state surviving reset) comparison")
    option(p, "--no-prefix-reuse", False, "skip the prefix-reuse phases (sequences sharing prefixes)")
    option(p, "--hf-no-position-ids", False, "drive transformers without position_ids (the left-padding bug class)")
    option(p, "--noise", 1e-4, "float-noise threshold on max |Δlogit|")
    option(p, "--floor-multiple", 4.0, "a difference below this many times the reference's noise floor passes (0: off)")
    option(p, "--bug", 1.0, "bug threshold on max |Δlogit|")
    option(p, "--rel-bug", 1.0, "bug threshold in standard deviations of the reference logits")
    fail_on = "lowest verdict of an implementation that makes the exit status 1"
    option(p, "--fail-on", "bug", fail_on, choices=VERDICTS[1:])


def run(args: argparse.Namespace) -> int:
    """Call :func:`genprobe.verify_caches` (which refuses what does not apply), print the tables; exit 0/1/3 (2 via
    ValueError)."""
    from ..verify.api import verify_caches

    model = None if args.model is None else load_model_arg(args)
    if model is not None and args.weight_dtype != "float32":
        head = ", the output layer too" if args.narrow_output else ""
        info(f"weights: linear layers stored in {args.weight_dtype}{head} (weight-only): the verdict is that model's")
    if args.impl:
        user_project_importable()
    given = {k: getattr(args, k) for k in ("compiled", "mutants", "max_new_tokens", "window", "sinks")}
    skipped = {k: not getattr(args, f"no_{k}") for k in ("padded_batch", "isolation", "prefix_reuse")}
    result = verify_caches(
        model,
        args.impl,
        hf_caches=args.hf_cache,
        prompts=read_prompts(args),
        chunk_sizes=integers("--chunk-sizes", args.chunk_sizes),
        hf_position_ids=not args.hf_no_position_ids,
        thresholds=thresholds_of(args),
        log=info,
        **given,
        **skipped,
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


# ---- tables --------------------------------------------------------------------------------------------
def _yes(x: bool) -> str:
    return "yes" if x else "no"


SUMMARY: tuple[Column, ...] = (  # over (report, its mutant row or None)
    ("implementation", -30, lambda r: r[0].impl[:30]),
    ("verdict", 11, lambda r: r[0].verdict),
    ("prefill\nexact", 8, lambda r: _yes(r[0].prefill_bit_identical)),
    ("max |Δ|\nlogit", 11, lambda r: fmt(r[0].max_abs_dlogit, ".4g")),
    ("Δ/σ", 8, lambda r: fmt(r[0].max_rel_dlogit)),
    ("margin", 7, lambda r: fmt(r[0].bug_margin)),
    ("top-1\nagree", 7, lambda r: fmt(r[0].min_top1_agreement, ".3f")),
    ("worst phase", 21, lambda r: str(r[0].worst_phase or "—")[:21]),
    ("text\ndiv.", 5, lambda r: r[0].text_divergences),
    ("text\nonly", 5, lambda r: _yes(r[0].text_only_would_catch)),
)
MUTANT: tuple[Column, ...] = (
    ("expected", 9, lambda r: r[1]["expected"] if r[1] else ""),
    ("ok", 3, lambda r: ("✓" if r[1]["as_expected"] else "✗") if r[1] else ""),
)


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
    mutants: list[Any] = result.mutants.rows if result.mutants is not None else []
    rows = list(zip(result.all_reports, [None] * len(result.reports) + mutants, strict=True))
    print(table(SUMMARY + (MUTANT if mutants else ()), rows, rule=True), file=out)
    if (floor := result.noise_floor) is not None:
        how = ", ".join(f"{k} {v:.3g}" for k, v in floor["sources"].items())
        print(
            f"\nnoise floor of the reference on this model: {floor['value']:.3g} ({how}); pass line "
            f"max({th.noise:g}, {th.floor_multiple:g} x floor) = {result.pass_line:.3g}",
            file=out,
        )
    if reuse := next((r.reuse for r in result.all_reports if r.reuse), None):
        print("prefix reuse exercised: " + "; ".join(reuse), file=out)
    for r in result.all_reports:
        for p in r.phases:
            bad = [row for row in p.per_row or [] if row["top1_disagreement"] > 0]
            if bad:
                rows_ = ", ".join(f"row of {x['prompt_length']} tokens {x['top1_disagreement']:.0%}" for x in bad)
                print(f"{r.impl}: padded rows whose top-1 differs from the prompt run alone: {rows_}", file=out)
    phases = list(dict.fromkeys(p.phase for r in result.all_reports for p in r.phases))
    if phases:
        print(
            "\nmax |Δlogit| per phase, @ first call above noise (0 = prefill call, k = k-th step or chunk):", file=out
        )
        cells = [
            (ph, 14, lambda r, ph=ph: next((_phase_cell(p) for p in r.phases if p.phase == ph), "—")) for ph in phases
        ]
        print(table([("implementation", -30, lambda r: r.impl[:30]), *cells], result.all_reports), file=out)
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


COMMANDS = (Command("verify-cache", __doc__, run, options, EPILOG, model=MODEL_KINDS, optional_model=True),)
