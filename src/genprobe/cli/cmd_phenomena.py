"""The chapter's training-free phenomena on any model (diversity, entropy, order trap, exposure, cache).

Writes phenomena.json: greedy vs sampled distinct-2 and loop share, next-token entropy vs τ, the sampler-order trap,
teacher forcing vs free running, one changed token (shadow and divergence), naive vs cached generation. Without
--prompts / --val-text the inputs are held out from the model's corpus: Tang openings and poems, or English sentence
openings and news documents (the Lee corpus: run `genprobe fetch english` once).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .._io import json_safe
from ._common import (
    MODEL_KINDS,
    Command,
    add_max_new_tokens,
    check_min,
    emit_json,
    fields_of,
    info,
    load_model_arg,
    option,
    out_dir,
    write_out,
)


def options(p: argparse.ArgumentParser) -> None:
    option(p, "--prompts", metavar="FILE", help="prompts to continue: one per line, or JSONL (prompt/text)")
    option(p, "--val-text", metavar="FILE", help="real texts to read and continue: one per line, or JSONL (text)")
    corpus = "default inputs (auto: tang for a tokenizer of at most one token per Chinese character, else english)"
    option(p, "--corpus", "auto", corpus, choices=("auto", "tang", "english"))
    add_max_new_tokens(p, 48)
    option(p, "--count", 64, "prompts and texts used", metavar="N")
    option(p, "--prefix-tokens", 16, "tokens of each text fed first", metavar="N")
    option(p, "--batch-size", 16, "rows per forward", metavar="N")
    option(p, "--seed", 0, "sampling seed")
    option(p, "--timing-batches", [1, 16], "batch sizes timed", metavar="N")
    option(p, "--no-timing", False, "skip the naive vs cached timing")
    option(p, "--out", metavar="DIR", type=Path, help="write DIR/phenomena.json")


def run(args: argparse.Namespace) -> int:
    """Handler: :func:`genprobe.chapter_phenomena` (prompts and texts from the files, else ``--corpus``), then
    phenomena.json and a summary."""
    from ..corpus.inputs import read_prompt_file
    from ..experiments.phenomena import PhenomenaConfig, chapter_phenomena
    from ..report.claims import summary_lines

    check_min(args, count=1)
    if args.out is not None:
        out_dir(args.out, "phenomena.json")
    cfg = fields_of(PhenomenaConfig, args, max_texts=args.count)
    prompts = read_prompt_file(args.prompts)[: args.count] if args.prompts else None
    texts = read_prompt_file(args.val_text) if args.val_text else None
    sources = {"prompts_file": args.prompts, "text_file": args.val_text}
    model = load_model_arg(args)
    result = chapter_phenomena(
        model, prompts, texts, corpus=args.corpus, config=cfg, timing=not args.no_timing, sources=sources, log=info
    )
    data = json_safe(result)
    write_out(args, "phenomena.json", data)
    if args.json:
        emit_json(data)
    else:
        print("\n".join(summary_lines(data)))
    return 0


COMMANDS = (Command("phenomena", __doc__, run, options, model=MODEL_KINDS),)
