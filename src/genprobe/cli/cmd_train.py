"""``genprobe train``: corpus → tokenizer → reference GPT → checkpoint directory."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ._common import add_json_flag, emit_json, info

SUMMARY_KEYS = ("parameters", "train_loss", "val_loss", "unigram_ce", "coverage", "unk_share", "seconds")


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``train`` sub-command."""
    from ..corpus.tang import DEFAULT_POEMS
    from ..model.config import POS_ENCODINGS, GPTConfig
    from ..model.train import TrainConfig

    d = TrainConfig()
    p = sub.add_parser(
        "train",
        help="train the reference character-level GPT and save a checkpoint",
        description="Train the reference GPT on the bundled Tang poems (or --corpus FILE) and save a "
        "safetensors checkpoint to --out. Progress goes to stderr; --json prints the summary on stdout.",
    )
    p.add_argument("--out", required=True, type=Path, help="checkpoint directory to write")
    p.add_argument("--poems", type=int, default=DEFAULT_POEMS, help=f"first N poems / JSONL lines (default {DEFAULT_POEMS})")
    p.add_argument("--vocab", type=int, default=1200, help="number of characters in the vocabulary (default 1200)")
    p.add_argument("--steps", type=int, default=d.steps, help=f"optimizer steps (default {d.steps})")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help=f"rows per step (default {d.batch_size})")
    p.add_argument("--seed", type=int, default=d.seed, help=f"random seed (default {d.seed})")
    p.add_argument("--lr", type=float, default=d.lr, help=f"peak learning rate (default {d.lr})")
    p.add_argument("--dropout", type=float, default=d.dropout, help=f"dropout probability while training (default {d.dropout})")
    p.add_argument("--corpus", type=Path, default=None, help="your own UTF-8 .txt or .jsonl(.xz) file")
    p.add_argument("--pack", action="store_true", help="pack whole documents per row (block-diagonal causal mask)")
    p.add_argument("--pe", choices=POS_ENCODINGS, default="learned", help="position encoding (default learned)")
    p.add_argument("--track-grads", action="store_true", help="record Q/K/V gradient norms per step into --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Train, save atomically, print the summary."""
    from ..corpus import CharTokenizer, load_corpus
    from ..model.checkpoint import META, is_checkpoint, save_checkpoint
    from ..model.config import GPTConfig
    from ..model.train import TrainConfig, train

    out: Path = args.out
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / META).exists():
        raise ValueError(f"--out {out} is a non-empty directory that is not a genprobe checkpoint; refusing to write into it")
    if args.vocab < 1:
        raise ValueError(f"--vocab must be >= 1, got {args.vocab}")
    tc = TrainConfig(steps=args.steps, batch_size=args.batch_size, seed=args.seed, lr=args.lr, pack=args.pack,
                     dropout=args.dropout)
    corpus = load_corpus(args.corpus, poems=args.poems)
    tok = CharTokenizer.from_text(corpus.text, args.vocab)
    cfg = GPTConfig(vocab_size=tok.vocab_size, pos_encoding=args.pe, dropout=args.dropout)
    cs = corpus.summary()
    info(
        f"corpus {cs['source']}: {cs['documents']:,} documents, {cs['chars']:,} chars "
        f"(train {cs['train_chars']:,} / val {cs['val_chars']:,}); vocabulary {tok.vocab_size:,} ids"
    )
    tracker = None
    if args.track_grads:
        from ..attention.gradients import QKVGradTracker  # lazy: optional diagnostics module

        tracker = QKVGradTracker()
    progress = not args.no_progress and sys.stderr.isatty()
    result = train(corpus, tok, cfg=cfg, tc=tc, progress=progress, on_backward=tracker)
    save_checkpoint(out, result.model, tok, result.summary)
    s = dict(result.summary)
    s["out"] = str(out)
    s["checkpoint"] = is_checkpoint(out)
    s["config"] = cfg.to_dict()
    if tracker is not None:
        s["grad_tracking"] = tracker.save(out)
    info(_table(s))
    if args.json:
        emit_json(s)
    return 0


def _table(s: dict) -> str:
    """Train and validation loss side by side with the unigram baseline (the overfitting check)."""
    gap = s["unigram_ce"] - s["val_loss"]
    return "\n".join(
        [
            f"{'':14}{'train':>9}{'val':>9}",
            f"{'loss (nats)':14}{s['train_loss']:>9.4f}{s['val_loss']:>9.4f}",
            f"{'unigram CE':14}{'':>9}{s['unigram_ce']:>9.4f}   (val is {gap:.3f} nats below it)",
            f"coverage {s['coverage']:.2%} of corpus characters, <unk> share {s['unk_share']:.2%}",
            f"parameters {s['parameters']:,}, {s['seconds']:.1f} s, checkpoint: {s['out']}",
        ]
    )
