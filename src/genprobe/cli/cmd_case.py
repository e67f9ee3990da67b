"""Run the case study: train/reuse the default model, every experiment, JSON + figures + HTML report.

The chapter's case study (《训练与推理的两副面孔》, "The two faces of training and inference") as one command: reproduce
the chapter's measurements on the bundled Tang-poem GPT. Writes OUT/ch3_case.json, OUT/fig_*.png and one offline
OUT/report.html. Without MODEL the default model is trained into OUT/model (reused when already there).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ._common import Command, emit_json, info, option, show_progress, table


def options(p: argparse.ArgumentParser) -> None:
    option(p, "--out", required=True, type=Path, metavar="DIR", help="output directory")
    option(p, "--quick", False, "reduced run for CI / first contact (quick recipe, fewer timing reps, a smaller model)")
    experiments = "decoding sampling exposure cache_exact cache_bugs mask_noop cache_timing cache_scaling"
    option(p, "--only", [], f"run only these experiments ({experiments})", metavar="EXP")
    option(p, "--skip", [], "skip these experiments", metavar="EXP")
    option(p, "--no-progress", False, "no progress bars")


def run(args: argparse.Namespace) -> int:
    """Handler: the case study (``genprobe.run_case``), then its headline table."""
    from ..experiments.case import run_case

    bars = show_progress(args)
    study = run_case(args.out, args.model, quick=args.quick, only=args.only, skip=args.skip, progress=bars, log=info)
    if args.json:
        emit_json(study)
        return 0
    w = max(len(a) for a, *_ in study.headline)
    short = lambda i: lambda r: _short(r[i])  # noqa: E731
    print(table([("", -w, lambda r: r[0]), ("ours", 15, short(1)), ("seed", 15, short(2))], study.headline))
    print(f"\nwrote {study.json_path}, {len(study.figures)} figures and {study.report} in {study.seconds:.0f} s")
    return 0


def _short(x) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.3g}" if abs(x) < 1e-3 and x != 0 else f"{x:.4g}"
    if isinstance(x, int):
        return f"{x:,}"
    return str(x)


MODEL_HELP = "a genprobe checkpoint directory to study (default: train one into OUT/model)"
COMMANDS = (Command("case", __doc__, run, options, model=("checkpoint",), model_help=MODEL_HELP, optional_model=True),)
