"""``genprobe case``: the chapter's case study (《训练与推理的两副面孔》, "The two faces of training and inference") as
one command → ch3_case.json, figures, report.html; without MODEL the default model is trained into OUT/model.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .._io import json_safe
from ._common import add_json_flag, add_model_argument, emit_json, info, option, show_progress


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``case`` sub-command."""
    p = sub.add_parser(
        "case",
        help="run the case study: train/reuse the default model, every experiment, JSON + figures + HTML report",
        description="Reproduce the chapter's measurements on the bundled Tang-poem GPT. Writes "
        "OUT/ch3_case.json, OUT/fig_*.png and one offline OUT/report.html. Without MODEL the default "
        "model is trained into OUT/model (reused when already there).",
    )
    add_model_argument(
        p,
        required=False,
        kinds=("checkpoint",),
        help="a genprobe checkpoint directory to study (default: train one into OUT/model)",
    )
    option(p, "--out", required=True, type=Path, metavar="DIR", help="output directory")
    option(p, "--quick", False, "reduced run for CI / first contact (quick recipe, fewer timing reps, a smaller model)")
    option(
        p,
        "--only",
        [],
        "run only these experiments (decoding sampling exposure cache_exact cache_bugs mask_noop "
        "cache_timing cache_scaling)",
        metavar="EXP",
    )
    option(p, "--skip", [], "skip these experiments", metavar="EXP")
    option(p, "--no-progress", False, "no progress bars")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Handler: the case study (``genprobe.experiments.case.case_study``), then its headline table."""

    from ..experiments.case import case_study, select_experiments

    only = select_experiments(args.only, args.skip)
    progress = show_progress(args)
    study = case_study(args.out, args.model, quick=args.quick, only=only, progress=progress, log=info)
    if args.json:
        emit_json(json_safe(study))
        return 0
    w = max(len(a) for a, *_ in study.headline)
    print(f"{'':{w}}  {'ours':>14}  {'seed':>14}")
    for a, b, c in study.headline:
        print(f"{a:{w}}  {_short(b):>14}  {_short(c):>14}")
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
