"""``genprobe convert-gguf MODEL.gguf --out DIR``: a GGUF file written once as a float32 transformers directory."""

from __future__ import annotations

import argparse
from pathlib import Path

from ._common import add_json_flag, add_model_argument, emit_json, info


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``convert-gguf`` sub-command."""
    p = sub.add_parser(
        "convert-gguf",
        help="dequantize a GGUF file into a float32 transformers directory (faster to load than the GGUF)",
        description="Every command takes a .gguf file as MODEL directly (dequantized on each load by transformers' "
        "GGUF support). Converting once writes config.json + model.safetensors + the tokenizer and chat template, "
        "and genprobe_gguf.json with each tensor's quantization type in the file.",
    )
    add_model_argument(p, kinds=("gguf",), help="a .gguf file")
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="directory to write (must not exist)")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Convert and report what the file held."""
    from ..model.gguf import convert_gguf, read_sidecar

    out = convert_gguf(Path(args.model), args.out)
    record = read_sidecar(out) or {}
    info(f"wrote {out} (tensor types in the GGUF file: {record.get('type_counts')})")
    if args.json:
        emit_json({"out": str(out), "gguf": record})
    return 0
