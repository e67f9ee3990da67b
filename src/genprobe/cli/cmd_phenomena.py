"""``genprobe phenomena MODEL``: the chapter's phenomena that need no training, on any model → phenomena.json.

    genprobe phenomena MODEL [--prompts FILE] [--val-text FILE] [--corpus auto|tang|english] [--max-new-tokens N]
                             [--count N] [--prefix-tokens N] [--batch-size N] [--seed N]
                             [--timing-batches N ...] [--no-timing] [--out DIR] [--json]

Greedy vs sampled distinct-2 and loop share, next-token entropy vs τ, the sampler-order trap, teacher forcing vs
free running, one changed token (shadow and divergence), naive vs cached generation. Without --prompts / --val-text the
inputs are held out from the model's corpus: Tang openings and poems, or English sentence openings and news
documents (the Lee corpus: run ``genprobe fetch english`` once).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from .._io import json_safe
from ._common import Accumulate, add_json_flag, add_max_new_tokens, add_model_argument, emit_json, info, load_model_arg

if TYPE_CHECKING:  # pragma: no cover
    from ..corpus.inputs import Inputs


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``phenomena`` sub-command."""
    p = sub.add_parser(
        "phenomena",
        help="the chapter's training-free phenomena on any model (diversity, entropy, order trap, exposure, cache)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_argument(p)
    p.add_argument("--prompts", metavar="FILE", help="prompts to continue: one per line, or JSONL (prompt/text)")
    p.add_argument("--val-text", metavar="FILE", help="real texts to read and continue: one per line, or JSONL (text)")
    p.add_argument(
        "--corpus",
        choices=("auto", "tang", "english"),
        default="auto",
        help="default inputs when --prompts/--val-text are not given (auto: tang for a tokenizer that spends at most "
        "one token per Chinese character, else english)",
    )
    add_max_new_tokens(p, 48)
    p.add_argument("--count", type=int, default=64, metavar="N", help="prompts and texts used (default 64)")
    p.add_argument("--prefix-tokens", type=int, default=16, metavar="N", help="tokens of each text fed first")
    p.add_argument("--batch-size", type=int, default=16, metavar="N", help="rows per forward (default 16)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--timing-batches",
        type=int,
        nargs="+",
        action=Accumulate,
        default=[1, 16],
        metavar="N",
        help="batch sizes timed (default 1 16)",
    )
    p.add_argument("--no-timing", action="store_true", help="skip the naive vs cached timing")
    p.add_argument("--out", metavar="DIR", type=Path, default=None, help="write DIR/phenomena.json")
    add_json_flag(p)
    p.set_defaults(func=run)


def _inputs(args: argparse.Namespace, model) -> "Inputs":
    """Prompts and texts from the files, else the defaults of ``--corpus`` (each side independently)."""
    from ..corpus.inputs import choose_inputs
    from ..loops.prompts import read_prompt_file

    prompts = read_prompt_file(args.prompts)[: args.count] if args.prompts else None
    texts = read_prompt_file(args.val_text) if args.val_text else None
    inp = choose_inputs(model, prompts, texts, args.corpus, args.count)
    return replace(inp, sources={"prompts_file": args.prompts, "text_file": args.val_text} | inp.sources)


def run(args: argparse.Namespace) -> int:
    """Handler: :func:`genprobe.experiments.phenomena.chapter_phenomena`, then phenomena.json and a summary."""
    from .._io import atomic_write_json
    from ..experiments.phenomena import PhenomenaConfig, chapter_phenomena
    from ..experiments.three_models import summary_lines

    if args.count < 1:
        raise ValueError(f"--count must be >= 1, got {args.count}")
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out {args.out} exists and is not a directory")
    cfg = PhenomenaConfig(
        max_new_tokens=args.max_new_tokens,
        prefix_tokens=args.prefix_tokens,
        max_texts=args.count,
        batch_size=args.batch_size,
        seed=args.seed,
        timing_batches=tuple(args.timing_batches),
    )
    model = load_model_arg(args)
    inp = _inputs(args, model)
    result = chapter_phenomena(
        model, inp.prompts, inp.texts, cfg, timing_on=not args.no_timing, sources=inp.sources, log=info
    )
    data = json_safe(result)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(args.out / "phenomena.json", data)
        info(f"wrote {args.out / 'phenomena.json'}")
    if args.json:
        emit_json(data)
    else:
        print("\n".join(summary_lines(data)))
    return 0
