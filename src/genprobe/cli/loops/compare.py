"""Which fix for loops: decode-time samplers beside the weight edit (one table, one figure, one HTML page)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..._io import json_safe
from ...engine.samplers.stages import PRESETS
from .._common import MODEL_KINDS, Command, check_min, emit_json, fields_of, info, option, out_dir, show_progress
from ._shared import (
    LOOPS_MODEL,
    add_loop_args,
    check_common,
    load_model_or_default,
    loop_settings_from,
    read_loop_prompts,
    scan_calibration,
)

COMPARE_FILES = "compare.json, compare-texts.json, compare.md, compare.png, compare.html"  # what --out DIR holds
COMPARE_SKIP = 2816  # direction + search + validation sets of a default `loops repair` (768 + 1024 + 1024)


def compare_options(c: argparse.ArgumentParser) -> None:
    from ...loops.compare_fixes import METHODS
    from ...loops.compare_human import GENRES

    add_loop_args(c, with_val=False, chat=False)
    option(c, "--n", type=int, help="at most N prompts (default: 512 Tang openings; every prompt of a file)")
    option(c, "--skip", COMPARE_SKIP, "Tang openings skipped first (the sets a default `loops repair` uses)")
    methods = f"methods to compare (default: all; greedy is always the baseline): {' '.join(METHODS)}"
    option(c, "--methods", [], methods, metavar="METHOD")
    patch = "loop patch from `loops repair` for the edit rows (applied in memory, reverted)"
    option(c, "--patch", type=Path, help=patch)
    judge = (
        "a second model that scores every method's text (NLL per character): a model directory or name, or "
        "ngram:english / ngram:FILE (a character n-gram model of human text)"
    )
    option(c, "--judge", metavar="MODEL", help=judge)
    option(c, "--genre", "auto", "tang: reduplication and couplet parallels; text: repeated n-grams", choices=GENRES)
    engine = "run every method as this engine does: its defaults, sampler order, arithmetic (default: genprobe's chain)"
    option(c, "--engine", choices=sorted(PRESETS), help=engine)
    option(c, "--timing-rounds", 3, "interleaved rounds of one batch per method for tokens/s")
    option(c, "--out", type=Path, required=True, metavar="DIR", help=f"directory for {COMPARE_FILES}")


COMPARE_JSON_KEYS = ("model", "judge", "n_prompts", "config", "best", "patch", "timings_s", "notes", "calibration")
METHOD_JSON_KEYS = ("sampler", "rates", "legit", "nll_own", "nll_judge", "cost")


def run_compare(args: argparse.Namespace) -> int:
    """Compare the fixes on one prompt set; write JSON, table, figure and page into --out."""
    from ...corpus.inputs import heldout_openings
    from ...loops.compare_fixes import CompareConfig, compare_fixes
    from ...loops.compare_human import NGRAM_PREFIX, ngram_judge, read_continuations
    from ...loops.pages import breaker_table, markdown_table, write_outputs
    from ...loops.patch import load_patch
    from ...model.load import load_model

    check_common(args)
    check_min(args, n=1, skip=0)
    out_dir(args.out, COMPARE_FILES)
    model = load_model_or_default(args)
    texts, source = read_loop_prompts(args, model)  # and human continuations from a JSONL file, or None
    conts = read_continuations(args.prompts) if texts is not None and getattr(args, "prompts", None) else None
    if texts is None:
        texts = heldout_openings(model.tokenizer, args.skip + (args.n or 512), args.prefix)[args.skip :]
        source = f"tang-heldout-openings (after the first {args.skip})"
    n = args.n or len(texts)
    texts, conts = texts[:n], None if conts is None else conts[:n]
    calibration = scan_calibration(args, model, texts)
    loop = calibration.settings if calibration is not None else loop_settings_from(args)
    cfg = fields_of(CompareConfig, args, loop=loop, methods=tuple(args.methods) or None)
    patch = load_patch(args.patch) if args.patch else None
    judge = None if not args.judge else (ngram_judge if args.judge.startswith(NGRAM_PREFIX) else load_model)(args.judge)
    res = compare_fixes(
        model,
        texts,
        cfg,
        patch=patch,
        patch_path=str(args.patch) if args.patch else None,
        judge=judge,
        continuations=conts,
        prompt_source=source,
        progress=show_progress(args),
        log=info,
    )
    if calibration is not None:
        res.calibration = json_safe(calibration)
        res.notes.append(f"detectors: {calibration.describe()}")
    files = write_outputs(res, args.out)
    info(markdown_table(res))
    info(breaker_table(res))
    if res.best is not None:
        info(f"best decode-time method: {res.best.name} (acceptable: {res.best.acceptable})")
    info(f"wrote {args.out} ({res.timings_s['total']} s)")
    if args.json:
        d = json_safe(res)  # the run and each method's measures (compare.json holds the texts too)
        methods = {m["name"]: {k: m[k] for k in METHOD_JSON_KEYS} for m in d["methods"]}
        paths = {k: str(v) for k, v in files.items()}
        emit_json({k: d[k] for k in COMPARE_JSON_KEYS} | {"methods": methods, "human": d["human"], "files": paths})
    return 0


COMPARE = Command("compare", __doc__ or "", run_compare, compare_options, model=MODEL_KINDS, **LOOPS_MODEL)
