"""llama.cpp quantization types side by side with the F32 GGUF: KL, top-1, perplexity, greedy divergence,
calibrated loop rates, speed.

Convert MODEL to an F32 GGUF with llama.cpp's converter, write each --types entry with its quantize API, and compare
every type with F32 in llama.cpp on real text and held-out prompts (and F32 in llama.cpp with transformers float32,
the engine itself; genprobe.serving.llamacpp.quant_study). Needs the llamacpp extra: exit status 2 when llama.cpp's
bindings are not installed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ._common import Command, add_max_new_tokens, check_min, emit_json, fields_of, info, option, out_dir
from ._vllm_args import add_kv_type, require_engine


def options(p: argparse.ArgumentParser) -> None:
    from ..serving.llamacpp.quantize import DEFAULT_TYPES, QUANT_TYPES

    option(p, "--types", list(DEFAULT_TYPES), f"GGUF types: {' '.join(QUANT_TYPES)}", metavar="TYPE")
    option(p, "--out", Path("out/quant"), "GGUF files and results", metavar="DIR")
    option(p, "--n-prompts", 96, "held-out prompts per type", metavar="N")
    add_max_new_tokens(p, 64)
    option(p, "--text-windows", 16, "real-text windows for KL/perplexity")
    option(p, "--window-tokens", 128, "tokens per text window")
    option(p, "--threads", 1, "llama.cpp threads, every type the same")
    option(p, "--samples", 3, "sample texts per type where greedy text changes")
    add_kv_type(p, "f32")  # f32: llama.cpp's f16 rounding stays out of the comparison


def run(args: argparse.Namespace) -> int:
    """Run the study, print the markdown table (stderr with --json), the JSON with --json."""
    from ..serving.llamacpp.quant_report import quant_compare, study_markdown
    from ..serving.llamacpp.quant_study import QuantStudyConfig
    from ..serving.llamacpp.quantize import check_types

    types = check_types(args.types)
    check_min(args, n_prompts=1, max_new_tokens=1, text_windows=1, window_tokens=2, threads=1)  # 2: a next token
    require_engine("llama.cpp")
    cfg = fields_of(QuantStudyConfig, args, types=tuple(types), prompts=args.n_prompts, samples=max(0, args.samples))
    out = out_dir(args.out, "GGUF files and results")
    study, _, _ = quant_compare(args.model, out, cfg, log=info)
    print(study_markdown(study), file=sys.stderr if args.json else sys.stdout)
    if args.json:
        emit_json(study)
    return 0


FLOAT_MODEL = (
    "the float model: a transformers directory (safetensors; e.g. the Llama reference from `genprobe train --arch "
    "llama`) or a fetched name (smollm2); llama.cpp's converter reads it"
)
COMMANDS = (Command("quant-compare", __doc__, run, options, model=("transformers", "name"), model_help=FLOAT_MODEL),)
