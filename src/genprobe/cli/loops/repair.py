"""``genprobe loops locate|repair MODEL``: the loop direction per layer, and the directional weight repair;
``genprobe loops apply|revert MODEL PATCH``: its exact, hash-checked patches."""

from __future__ import annotations

import argparse
import time
from functools import partial
from pathlib import Path
from typing import Any

from ..._io import check_target_dir, json_safe
from .._common import MODEL_KINDS, Command, emit_json, fields_of, info, option, out_dir, show_progress, write_out
from ._shared import (
    LOOPS_MODEL,
    add_config_flag,
    add_loop_args,
    check_common,
    load_model_or_default,
    loop_settings_from,
    repair_inputs,
    scan_calibration,
)

LOCATE_FILE = "locate.json"  # what locate --out DIR holds
REPAIR_FILES = "repair.json, patch.*, repair.html, repair.png"  # what repair --out DIR holds
# what `loops repair --json` prints (repair.json in --out holds everything)
REPAIR_JSON_KEYS = tuple(
    "verdict end_token inputs baseline locate validation patch transfer timings_s wall_seconds files".split()
)


def locate_options(lo: argparse.ArgumentParser) -> None:
    add_loop_args(lo, with_val=True)
    add_config_flag(lo, "n_direction", "direction-set prompts", flag="--n")
    add_config_flag(lo, "method")
    add_config_flag(lo, "search_prone", "loop-prone prompts per ablation scan")
    add_config_flag(lo, "search_control", "non-looping control prompts per ablation scan")
    option(lo, "--out", type=Path, metavar="DIR", help=f"directory for {LOCATE_FILE}: the locate report")


REPAIR_FLAGS = {  # RepairConfig field -> help of its flag, in --help order (after --search)
    "n_direction": "direction-set prompts",
    "n_search": "search-set prompts",
    "n_validate": "held-out validation-set prompts",
    "search_prone": "loop-prone prompts per candidate evaluation",
    "search_control": "non-looping control prompts per candidate",
    "ks": "columns per layer to try",
    "subtract_alphas": "relative strengths for W[:,c] -= α·d (1 = remove the mean loop gap)",
    "project_alphas": "fractions for W[:,c] -= α·d(dᵀW[:,c])",
    "forms": "",
    "top_layers": "scaled: best-ranked layers tried",
    "keep": "scaled: screened edits that generate",
    "screen_sequences": "scaled: loops the probe reads",
    "screen_strengths": "scaled: admissible strengths per (layers, k, form) whose loop pressure is read, strongest "
    "first",
    "screen_windows": "scaled: validation windows of the screening regression check",
    "regression_windows": "validation windows of the regression check",
    "transfer": "held-out prompts also measured in the other setting (chat template or plain) before/after the edit, "
    "when the model has a chat template (0 = skip)",
    "method": "",
    "max_kl": "KL(base‖edited) limit, nats",
    "max_dloss": "validation-loss increase limit, nats",
}


def repair_options(r: argparse.ArgumentParser) -> None:
    from ...loops.study import EXHAUSTIVE_MAX

    add_loop_args(r, with_val=True)
    option(r, "--out", type=Path, required=True, metavar="DIR", help=f"directory for {REPAIR_FILES}")
    validate = "held-out validation prompts of your own; --prompts then feeds only the direction and search sets"
    option(r, "--validate-prompts", metavar="FILE", help=f"{validate} (a prompt in both files is refused)")
    search = (
        "exhaustive: generate for every edit of the grid; scaled: rank layers, screen strengths without generating, "
        f"halve on growing prompt subsets (docs/loop-repair-at-scale.md); auto: exhaustive up to {EXHAUSTIVE_MAX} "
        "candidates"
    )
    add_config_flag(r, "search", search)
    for name, help in REPAIR_FLAGS.items():
        add_config_flag(r, name, help, metavar="N" if name == "transfer" else None)


def run_repair(args: argparse.Namespace, locate_only: bool = False) -> int:
    """The whole pipeline, writing report, patch, HTML and PNG into --out; or (``loops locate``) its directions and
    per-layer ablations on the direction set only, written to --out/locate.json when given."""
    from ...loops.pages import rate_rows, write_repair
    from ...loops.repair import repair
    from ...loops.study import SET_NAMES, RepairConfig
    from ...metrics.stats import MIN_PAIRS

    check_common(args)
    if not locate_only:
        out_dir(args.out, REPAIR_FILES)
        minimum = {"--n-direction": 2, "--n-search": MIN_PAIRS, "--n-validate": MIN_PAIRS}
        given = dict(zip(minimum, (args.n_direction, args.n_search, args.n_validate), strict=True))
        if small := [f"{flag} {given[flag]}" for flag, least in minimum.items() if given[flag] < least]:
            raise ValueError(
                f"{', '.join(small)}: too small for a verdict; the minimum sizes are "
                f"{', '.join(f'{k} {v}' for k, v in minimum.items())} (below {MIN_PAIRS} paired prompts no change can "
                f"be significant — two-sided sign test, α = 0.05: {MIN_PAIRS} that all change the same way give p = "
                "0.031; the direction contrasts at least one loop-prone and one control prompt)"
            )
    elif args.out:
        out_dir(args.out, LOCATE_FILE)
    t0 = time.perf_counter()
    # refuses bad settings before the model loads
    cfg = fields_of(RepairConfig, args, prefix_chars=args.prefix, loop=loop_settings_from(args))
    model = load_model_or_default(args)
    inputs = repair_inputs(args, model, cfg, SET_NAMES[:1] if locate_only else SET_NAMES)
    # the detectors calibrated on human text of the direction prompts' language: what counts as degenerate decides
    # which prompts are loop-prone
    calibration = scan_calibration(args, model, inputs.direction)
    if calibration is not None:
        cfg.loop = calibration.settings
    report, patch = repair(model, inputs, cfg, locate_only=locate_only, progress=show_progress(args), log=info)
    if locate_only:
        data = json_safe(report) | {"calibration": json_safe(calibration)}
        write_out(args, LOCATE_FILE, data)
        if args.json:
            emit_json(data)
        return 0
    wall_seconds = round(time.perf_counter() - t0, 1)
    data = write_repair(
        args.out, report, patch, calibration=calibration, model_path=model.source, wall_seconds=wall_seconds
    )
    info(f"verdict: {report.verdict} ({data['wall_seconds']} s); wrote {args.out}")
    if (v := data["validation"]) is not None:  # the held-out rates before → after, the regression, the patch's size
        for r in rate_rows(v["before"], v["after"]):
            info(f"  {r['label']}: {r['before']} → {r['after']}")
        size = f"{100 * data['patch']['fraction_changed']:.3f}% of weights" if data["patch"] else "no patch"
        info(f"  KL {v['regression']['kl']:.4f}, Δloss {v['regression']['dloss']:+.4f}; {size}")
    if args.json:
        emit_json({k: data[k] for k in REPAIR_JSON_KEYS} | {"chosen": data["search"]["chosen"]})
    return 0


LOCATE_HELP = "loop direction per layer and the loop rate with each layer's direction ablated"
LOCATE = Command(
    "locate", LOCATE_HELP, partial(run_repair, locate_only=True), locate_options, model=MODEL_KINDS, **LOOPS_MODEL
)
REPAIR_HELP = "full pipeline: scan, direction, locate, α/layer/k/form search, validate, patch"
REPAIR = Command("repair", REPAIR_HELP, run_repair, repair_options, model=MODEL_KINDS, **LOOPS_MODEL)


# ---- apply / revert a patch -------------------------------------------------------------------
def patch_options(a: argparse.ArgumentParser) -> None:
    a.add_argument("patch", type=Path, help="patch file (.json or .safetensors, the other is found beside it)")
    g = a.add_mutually_exclusive_group(required=True)
    g.add_argument("--out", type=Path, metavar="DIR", help="directory for the written model (new or empty)")
    g.add_argument("--in-place", action="store_true", help="overwrite MODEL's weight files")


def run_patch_action(args: argparse.Namespace, revert: bool) -> int:
    """Apply a patch (hash-checked) and write the patched model, or revert one (hash-checked both ways) and write
    the original model."""
    from ...loops.patch import apply_patch, load_patch, patch_dir, revert_patch
    from ...model.checkpoint import META, is_checkpoint, load_checkpoint, save_checkpoint

    patch = load_patch(args.patch)
    src = Path(args.model)
    out = src if args.in_place else args.out
    action = "revert" if revert else "apply"
    changed = {k: patch.meta.get(k) for k in ("weights_changed", "fraction_changed")}
    res: dict[str, Any] = {"action": action, "model": str(src), **changed, "out": str(out)}
    if is_checkpoint(src):
        module, tokenizer, meta = load_checkpoint(src)
        res["state_sha256"] = (revert_patch if revert else apply_patch)(module, patch)
        if not args.in_place:
            check_target_dir(out, META, "a genprobe checkpoint")
        summary = {k: v for k, v in meta.get("summary", {}).items() if k != "loop_patch"}
        if not revert:
            keep = ("sha256_before", "sha256_after", "edit")
            summary["loop_patch"] = {"patch": str(args.patch)} | {k: patch.meta.get(k) for k in keep}
        save_checkpoint(out, module, tokenizer, summary)
    else:
        r = patch_dir(src, patch, out, revert)
        res.update(json_safe(r))
        for n in r.notes:
            info(f"note: {n}")
    info(f"{action}: wrote {res['out']} (state sha256 {res['state_sha256'][:16]}…)")
    if args.json:
        emit_json(res)
    return 0


PATCHED: dict[str, Any] = {
    "model": ("checkpoint", "transformers"),
    "model_help": "a genprobe checkpoint or a transformers model directory",
}
APPLY_HELP = "apply a patch to a model directory (refused if its weights hash differs)"
APPLY = Command("apply", APPLY_HELP, partial(run_patch_action, revert=False), patch_options, **PATCHED)
REVERT_HELP = "restore the exact original weights of a patched model directory"
REVERT = Command("revert", REVERT_HELP, partial(run_patch_action, revert=True), patch_options, **PATCHED)
