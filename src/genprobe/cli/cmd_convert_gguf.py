"""Dequantize a GGUF file into a float32 transformers directory (faster to load than the GGUF).

Every command takes a .gguf file as MODEL directly (dequantized on each load by transformers' GGUF support).
Converting once writes config.json + model.safetensors + the tokenizer and chat template, and genprobe_gguf.json
with each tensor's quantization type in the file.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ._common import Command, emit_json, info, option


def run(args: argparse.Namespace) -> int:
    """Convert and report what the file held."""
    from ..model.gguf import convert_gguf, read_sidecar

    out = convert_gguf(Path(args.model), args.out)
    record = read_sidecar(out) or {}
    info(f"wrote {out} (tensor types in the GGUF file: {record.get('type_counts')})")
    if args.json:
        emit_json({"out": str(out), "gguf": record})
    return 0


def options(p: argparse.ArgumentParser) -> None:
    option(p, "--out", type=Path, required=True, metavar="DIR", help="directory to write (must not exist)")


COMMANDS = (Command("convert-gguf", __doc__, run, options, model=("gguf",), model_help="a .gguf file"),)
