"""``genprobe loops apply|revert MODEL PATCH``: exact, hash-checked loop patches."""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path
from typing import Any

from ..._io import check_target_dir, json_safe
from .._common import Command, emit_json, info


def patch_options(a: argparse.ArgumentParser) -> None:
    a.add_argument("patch", type=Path, help="patch file (.json or .safetensors, the other is found beside it)")
    g = a.add_mutually_exclusive_group(required=True)
    g.add_argument("--out", type=Path, metavar="DIR", help="directory for the written model (new or empty)")
    g.add_argument("--in-place", action="store_true", help="overwrite MODEL's weight files")


def _write_ckpt(args: argparse.Namespace, model: Any, note: dict) -> Path:
    from ...model.checkpoint import META, save_checkpoint

    out = Path(args.model) if args.in_place else args.out
    if not args.in_place:
        check_target_dir(out, META, "a genprobe checkpoint")
    summary = dict(model.meta.get("summary", {}))
    summary.pop("loop_patch", None)
    if note:
        summary["loop_patch"] = note
    save_checkpoint(out, model.module, model.tokenizer, summary)
    return out


def run_patch_action(args: argparse.Namespace, revert: bool) -> int:
    """Apply a patch (hash-checked) and write the patched model, or revert one (hash-checked both ways) and write
    the original model."""
    from ...loops.patch import apply_patch, apply_to_dir, load_patch, revert_dir, revert_patch
    from ...model.checkpoint import is_checkpoint
    from ...model.load import load_model

    patch = load_patch(args.patch)
    src = Path(args.model)
    action = "revert" if revert else "apply"
    res: dict[str, Any] = {
        "action": action,
        "model": str(src),
        "weights_changed": patch.meta.get("weights_changed"),
        "fraction_changed": patch.meta.get("fraction_changed"),
    }
    if is_checkpoint(src):
        model = load_model(src)
        sha = (revert_patch if revert else apply_patch)(model.module, patch)
        keep = ("sha256_before", "sha256_after", "edit")
        note = {} if revert else {"patch": str(args.patch)} | {k: patch.meta.get(k) for k in keep}
        res.update(out=str(_write_ckpt(args, model, note)), state_sha256=sha)
    else:
        out = src if args.in_place else args.out
        r = (revert_dir if revert else apply_to_dir)(src, patch, out)
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
