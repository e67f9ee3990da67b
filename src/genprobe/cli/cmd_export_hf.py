"""``genprobe export-hf`` / ``genprobe import-hf``: checkpoint ⇄ ``GPT2LMHeadModel`` directory."""

from __future__ import annotations

import argparse
from pathlib import Path

from .._io import check_target_dir, json_safe
from ._common import Command, emit_json, info, option


def run_export(args: argparse.Namespace) -> int:
    """Export and report what was written."""
    from ..model.hf_dir import export_hf_dir

    res = export_hf_dir(Path(args.model), args.out, overwrite=args.force)
    info(f"wrote {res['out']}: {', '.join(res['files'])} ({res['parameters']:,} parameters)")
    info(f"load it with GPT2LMHeadModel.from_pretrained({str(res['out'])!r}) and AutoTokenizer.from_pretrained(...)")
    if args.json:
        emit_json(res)
    return 0


def run_import(args: argparse.Namespace) -> int:
    """Import and save as a checkpoint."""
    from ..model.checkpoint import META, save_checkpoint
    from ..model.hf_dir import import_hf_dir

    out: Path = args.out_ckpt
    check_target_dir(out, META, "a genprobe checkpoint", "output")
    model, tok = import_hf_dir(Path(args.model))
    save_checkpoint(out, model, tok, {"imported_from": str(args.model)})
    res = {
        "out": str(out),
        "source": str(args.model),
        "parameters": model.num_parameters(),
        "vocab_size": tok.vocab_size,
        "config": json_safe(model.cfg),
    }
    info(f"wrote checkpoint {out} ({res['parameters']:,} parameters, vocabulary {tok.vocab_size:,} ids)")
    if args.json:
        emit_json(res)
    return 0


def export_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", type=Path, help="directory to write (must be empty or absent unless --force)")
    option(p, "--force", False, "replace an existing non-empty OUT")


def import_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("out_ckpt", type=Path, help="genprobe checkpoint directory to write")


EXPORT = """Write a checkpoint as a directory GPT2LMHeadModel.from_pretrained loads offline.

Export a genprobe checkpoint (learned positions only) to a Hugging Face GPT-2 directory: config.json +
model.safetensors + a character-level tokenizer.json (AutoTokenizer) + genprobe_tokenizer.json.
"""
IMPORT = """Turn a GPT-2 directory (safetensors) back into a genprobe checkpoint.

Load a Hugging Face GPT-2 directory (offline, safetensors only, never pickle) with its character vocabulary and
save it as a genprobe checkpoint.
"""
CHECKPOINT = "genprobe checkpoint directory"
TRANSFORMERS = "transformers directory written by export-hf (or any char-level GPT-2 dir)"
COMMANDS = (
    Command("export-hf", EXPORT, run_export, export_options, model=("checkpoint",), model_help=CHECKPOINT),
    Command("import-hf", IMPORT, run_import, import_options, model=("transformers",), model_help=TRANSFORMERS),
)
