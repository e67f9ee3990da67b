"""``genprobe loops locate|repair MODEL``: the loop direction per layer, and the directional weight repair."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from ..._io import json_safe
from .._common import Accumulate, emit_json, info, out_dir
from ._shared import (
    add_calibration_args,
    add_data_args,
    add_model_args,
    calibrate_config,
    check_common,
    load_model_or_default,
    repair_config,
    repair_inputs,
    show_progress,
)

LOCATE_FILE = "locate.json"  # what locate --out DIR holds
# what `loops repair --json` prints (repair.json in --out holds everything)
REPAIR_JSON_KEYS = (
    "verdict",
    "end_token",
    "inputs",
    "baseline",
    "locate",
    "validation",
    "patch",
    "transfer",
    "timings_s",
    "wall_seconds",
    "files",
)


def register_locate(lsub: Any) -> None:
    from ...loops.repair import RepairConfig

    d = RepairConfig()
    lo = lsub.add_parser(
        "locate", help="loop direction per layer and the loop rate with each layer's direction ablated"
    )
    add_model_args(lo)
    add_data_args(lo, with_val=True)
    lo.add_argument("--n", type=int, default=d.n_direction, help=f"direction-set prompts (default {d.n_direction})")
    lo.add_argument("--method", choices=("mean_diff", "pca"), default=d.method)
    lo.add_argument("--search-prone", type=int, default=d.search_prone, help="loop-prone prompts per ablation scan")
    lo.add_argument(
        "--search-control", type=int, default=d.search_control, help="non-looping control prompts per ablation scan"
    )
    add_calibration_args(lo)
    lo.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help=f"directory for {LOCATE_FILE}: the locate report (created if missing)",
    )
    lo.set_defaults(func=run_locate)


def register_repair(lsub: Any) -> None:
    from ...loops.repair import RepairConfig

    d = RepairConfig()
    r = lsub.add_parser("repair", help="full pipeline: scan, direction, locate, α/layer/k/form search, validate, patch")
    add_model_args(r)
    add_data_args(r, with_val=True)
    r.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="DIR",
        help="directory for repair.json, patch.*, repair.html, repair.png",
    )
    r.add_argument(
        "--validate-prompts",
        metavar="FILE",
        default=None,
        help="held-out validation prompts of your own (the first --n-validate distinct ones); --prompts then feeds "
        "only the direction and search sets (a prompt in both files is refused)",
    )
    r.add_argument("--n-direction", type=int, default=d.n_direction)
    r.add_argument("--n-search", type=int, default=d.n_search)
    r.add_argument("--n-validate", type=int, default=d.n_validate)
    r.add_argument(
        "--search-prone", type=int, default=d.search_prone, help="loop-prone prompts per candidate evaluation"
    )
    r.add_argument(
        "--search-control", type=int, default=d.search_control, help="non-looping control prompts per candidate"
    )
    _grid_args(r)
    _search_args(r)
    r.add_argument("--method", choices=("mean_diff", "pca"), default=d.method)
    r.add_argument("--max-kl", type=float, default=d.max_kl, help="KL(base‖edited) limit, nats (default 0.1)")
    r.add_argument(
        "--max-dloss", type=float, default=d.max_dloss, help="validation-loss increase limit, nats (default 0.02)"
    )
    add_calibration_args(r)
    r.set_defaults(func=run_repair)


def _grid_args(r: argparse.ArgumentParser) -> None:
    from ...loops.repair import RepairConfig

    d = RepairConfig()
    r.add_argument(
        "--ks",
        type=int,
        nargs="+",
        action=Accumulate,
        default=list(d.ks),
        help=f"columns per layer to try (default {list(d.ks)})",
    )
    r.add_argument(
        "--subtract-alphas",
        type=float,
        nargs="+",
        action=Accumulate,
        default=list(d.subtract_alphas),
        help="relative strengths for W[:,c] -= α·d (1 = remove the mean loop gap)",
    )
    r.add_argument(
        "--project-alphas",
        type=float,
        nargs="+",
        action=Accumulate,
        default=list(d.project_alphas),
        help="fractions for W[:,c] -= α·d(dᵀW[:,c])",
    )
    r.add_argument("--forms", nargs="+", action=Accumulate, choices=("subtract", "project"), default=list(d.forms))


def _search_args(r: argparse.ArgumentParser) -> None:
    from ...loops.repair import RepairConfig
    from ...loops.study import EXHAUSTIVE_MAX, SEARCHES

    d = RepairConfig()
    r.add_argument(
        "--search",
        choices=SEARCHES,
        default=d.search,
        help=f"exhaustive: generate for every edit of the grid; scaled: rank layers, screen strengths without "
        f"generating, halve on growing prompt subsets (docs/loop-repair-at-scale.md); auto (default): exhaustive "
        f"up to {EXHAUSTIVE_MAX} candidates",
    )
    r.add_argument("--top-layers", type=int, default=d.top_layers, help="scaled: best-ranked layers tried (default 3)")
    r.add_argument("--keep", type=int, default=d.keep, help="scaled: screened edits that generate (default 8)")
    r.add_argument(
        "--screen-sequences", type=int, default=d.screen_sequences, help="scaled: loops the probe reads (default 8)"
    )
    r.add_argument(
        "--screen-strengths",
        type=int,
        default=d.screen_strengths,
        help="scaled: admissible strengths per (layers, k, form) whose loop pressure is read, strongest first "
        "(default 2)",
    )
    r.add_argument(
        "--screen-windows",
        type=int,
        default=d.screen_windows,
        help="scaled: validation windows of the screening regression check (default 8)",
    )
    r.add_argument(
        "--regression-windows",
        type=int,
        default=d.regression_windows,
        help=f"validation windows of the regression check (default {d.regression_windows})",
    )
    r.add_argument(
        "--transfer",
        type=int,
        default=d.transfer,
        metavar="N",
        help=f"held-out prompts also measured in the other setting (chat template or plain) before/after the edit, "
        f"when the model has a chat template (default {d.transfer}; 0 = skip)",
    )


def run_locate(args: argparse.Namespace) -> int:
    """Directions and per-layer ablation on the direction set only."""
    from ..._io import atomic_write_json
    from ...loops.repair import locate_only

    check_common(args)
    if args.out:
        out_dir(args.out, LOCATE_FILE)
    model = load_model_or_default(args)
    cfg = repair_config(
        args, n_direction=args.n, method=args.method, search_prone=args.search_prone, search_control=args.search_control
    )
    inputs = repair_inputs(args, model, cfg, ("direction",))
    calibration = calibrate_config(args, model, cfg, inputs)
    rep = locate_only(model, inputs, cfg, progress=show_progress(args), log=info)
    for a in rep.locate.per_layer:
        info(
            f"  layer {a.layers[0]}: degenerate rate {a.degenerate_rate:.3f} (exact loops {a.loop_rate:.3f}; "
            f"reduction {a.reduction:+.3f})"
        )
    info(f"  ranking: {rep.locate.ranking}")
    data = json_safe(rep) | {"calibration": json_safe(calibration) if calibration is not None else None}
    if args.out:
        atomic_write_json(args.out / LOCATE_FILE, data)
        info(f"wrote {args.out / LOCATE_FILE}")
    if args.json:
        emit_json(data)
    return 0


def _check_repair_args(args: argparse.Namespace) -> None:
    out_dir(args.out, "repair.json, patch.*, repair.html, repair.png")
    from ...metrics.stats import MIN_PAIRS

    minimum = {"--n-direction": 2, "--n-search": MIN_PAIRS, "--n-validate": MIN_PAIRS}
    given = {"--n-direction": args.n_direction, "--n-search": args.n_search, "--n-validate": args.n_validate}
    small = [f"{flag} {given[flag]}" for flag, least in minimum.items() if given[flag] < least]
    if small:
        raise ValueError(
            f"{', '.join(small)}: too small for a verdict; the minimum sizes are "
            f"{', '.join(f'{k} {v}' for k, v in minimum.items())} (below {MIN_PAIRS} paired prompts no change can be "
            f"significant — two-sided sign test, α = 0.05: {MIN_PAIRS} that all change the same way give p = 0.031; "
            "the direction contrasts at least one loop-prone and one control prompt)"
        )
    grids = (("--ks", args.ks), ("--subtract-alphas", args.subtract_alphas), ("--project-alphas", args.project_alphas))
    for name, vals in grids:
        if any(x <= 0 for x in vals):
            raise ValueError(f"{name} values must be > 0, got {vals}")


def run_repair(args: argparse.Namespace) -> int:
    """The whole pipeline; writes report, patch, HTML and PNG into --out."""
    from ..._io import atomic_write_json
    from ...loops.patch import save_patch
    from ...loops.repair import repair
    from ...loops.report import write_summary

    check_common(args)
    _check_repair_args(args)
    t0 = time.perf_counter()
    model = load_model_or_default(args)
    cfg = repair_config(
        args,
        n_direction=args.n_direction,
        n_search=args.n_search,
        n_validate=args.n_validate,
        search_prone=args.search_prone,
        search_control=args.search_control,
        ks=tuple(args.ks),
        subtract_alphas=tuple(args.subtract_alphas),
        project_alphas=tuple(args.project_alphas),
        forms=tuple(args.forms),
        method=args.method,
        max_kl=args.max_kl,
        max_dloss=args.max_dloss,
        search=args.search,
        top_layers=args.top_layers,
        keep=args.keep,
        screen_sequences=args.screen_sequences,
        screen_windows=args.screen_windows,
        screen_strengths=args.screen_strengths,
        regression_windows=args.regression_windows,
        transfer=args.transfer,
    )
    inputs = repair_inputs(args, model, cfg, ("direction", "search", "validate"))
    calibration = calibrate_config(args, model, cfg, inputs)
    report, patch = repair(model, inputs, cfg, progress=show_progress(args), log=info)
    data = json_safe(report) | {"calibration": json_safe(calibration) if calibration is not None else None}
    args.out.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}
    if patch is not None:
        st, js = save_patch(patch, args.out / "patch")
        files.update(patch_tensors=str(st), patch=str(js))
    files.update({k: str(v) for k, v in write_summary(data, args.out).items()})
    data.update(model_path=str(model.source), wall_seconds=round(time.perf_counter() - t0, 1), files=files)
    atomic_write_json(args.out / "repair.json", data)
    info(f"verdict: {report.verdict} ({data['wall_seconds']} s); wrote {args.out}")
    _print_validation(report)
    if args.json:
        emit_json({k: data[k] for k in REPAIR_JSON_KEYS} | {"chosen": data["search"]["chosen"]})
    return 0


def _print_validation(report: Any) -> None:
    v = report.validation
    if v is None:
        return
    b, a = v.before, v.after
    info(
        f"  held-out exact loop rate {b.loop_rate:.3f} → {a.loop_rate:.3f}; near {b.near_loop_rate:.3f} → "
        f"{a.near_loop_rate:.3f}; repetitive {b.repetitive_rate:.3f} → {a.repetitive_rate:.3f}; degenerate "
        f"{b.degenerate_rate:.3f} → {a.degenerate_rate:.3f}"
    )
    info(
        f"  tail compression {b.mean_tail_compression:.2f} → {a.mean_tail_compression:.2f}; seq-rep-4 "
        f"{b.mean_seq_rep_4:.3f} → {a.mean_seq_rep_4:.3f}; KL {v.regression.kl:.4f}, Δloss {v.regression.dloss:+.4f}"
        + (f"; {100 * report.patch.fraction_changed:.3f}% of weights" if report.patch is not None else "; no patch")
    )
