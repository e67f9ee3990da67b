"""``genprobe train``: corpus → tokenizer → reference model → directory.

``--arch gpt`` (default): the character-level GPT, saved as a genprobe checkpoint.
``--arch llama|qwen2``: the subword reference model (byte-level BPE + transformers causal LM), saved as
a standard transformers directory; it trains on the corpus split of ``genprobe.corpus.tang.corpus_split``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .._io import check_target_dir, json_safe
from ._common import add_json_flag, emit_json, info

if TYPE_CHECKING:  # pragma: no cover
    from ..model.hf_train import SubwordModelConfig
    from ..model.train import TrainConfig


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``train`` sub-command."""
    from ..model.hf_train import SubwordModelConfig, default_train_config
    from ..model.train import TrainConfig

    # the defaults the help texts quote: the char GPT's, the subword recipe's, the subword model's shape
    d, q, m = TrainConfig(), default_train_config(), SubwordModelConfig()
    p = sub.add_parser(
        "train",
        help="train a reference model: the character-level GPT, or a Llama/Qwen2 with a BPE tokenizer",
        description="Train the reference GPT (--arch gpt, a genprobe checkpoint) or a small Llama/Qwen2 with a "
        "byte-level BPE (--arch llama|qwen2, a transformers directory) on the bundled Tang poems, and save it "
        "to --out. Progress goes to stderr; --json prints the summary on stdout.",
    )
    _add_common_arguments(p, d, q, m)
    _add_gpt_arguments(p, d)
    _add_subword_arguments(p, q, m)
    add_json_flag(p)
    p.set_defaults(func=run)


def _add_common_arguments(
    p: argparse.ArgumentParser, d: "TrainConfig", q: "TrainConfig", m: "SubwordModelConfig"
) -> None:
    """The flags of both architectures: what to train, on how much, for how long."""
    from ..corpus.tang import DEFAULT_POEMS, DEFAULT_SUBWORD_POEMS
    from ..model.hf_train import ARCHS

    p.add_argument(
        "--arch",
        choices=("gpt", *ARCHS),
        default="gpt",
        help="gpt: character GPT (default); llama / qwen2: transformers model with a BPE tokenizer",
    )
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="directory to write")
    p.add_argument(
        "--poems",
        type=int,
        default=None,
        help=f"gpt: first N poems / JSONL lines (default {DEFAULT_POEMS}); llama/qwen2: train on poems "
        f"before N except the char GPT's validation poems, hold out the rest "
        f"(default {DEFAULT_SUBWORD_POEMS:,})",
    )
    p.add_argument(
        "--vocab",
        type=int,
        default=None,
        help="gpt: characters in the vocabulary (default 1200); llama/qwen2: BPE vocabulary size "
        f"(default {m.vocab_size})",
    )
    p.add_argument(
        "--steps", type=int, default=None, help=f"optimizer steps (default gpt {d.steps}, llama/qwen2 {q.steps})"
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help=f"rows per step (default gpt {d.batch_size}, llama/qwen2 {q.batch_size})",
    )
    p.add_argument("--seed", type=int, default=d.seed, help=f"random seed (default {d.seed})")
    p.add_argument(
        "--lr", type=float, default=None, help=f"peak learning rate (default gpt {d.lr}, llama/qwen2 {q.lr})"
    )
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument(
        "--quick", action="store_true", help="seconds-long recipe for tests and smoke runs (explicit flags win)"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _add_gpt_arguments(p: argparse.ArgumentParser, d: "TrainConfig") -> None:
    """The ``--arch gpt`` group (:data:`GPT_ONLY`)."""
    from ..model.config import POS_ENCODINGS

    g = p.add_argument_group("--arch gpt only")
    g.add_argument(
        "--dropout", type=float, default=None, help=f"dropout probability while training (default {d.dropout})"
    )
    g.add_argument("--corpus", type=Path, default=None, help="your own UTF-8 .txt or .jsonl(.xz) file")
    g.add_argument("--pack", action="store_true", help="pack whole documents per row (block-diagonal causal mask)")
    g.add_argument("--pe", choices=POS_ENCODINGS, default=None, help="position encoding (default learned)")
    g.add_argument("--track-grads", action="store_true", help="record Q/K/V gradient norms per step into --out")


def _add_subword_arguments(p: argparse.ArgumentParser, q: "TrainConfig", m: "SubwordModelConfig") -> None:
    """The ``--arch llama / qwen2`` group (:data:`SUBWORD_ONLY`): the model's shape and the warmup."""
    h = p.add_argument_group("--arch llama / qwen2 only")
    h.add_argument("--layers", type=int, default=None, help=f"transformer layers (default {m.n_layer})")
    h.add_argument("--d-model", type=int, default=None, help=f"hidden size (default {m.d_model})")
    h.add_argument("--heads", type=int, default=None, help=f"query heads (default {m.n_head})")
    h.add_argument(
        "--kv-heads", type=int, default=None, help=f"key/value heads, divides --heads (default {m.n_kv_head})"
    )
    h.add_argument("--d-ff", type=int, default=None, help=f"SwiGLU width (default {m.d_ff})")
    h.add_argument(
        "--block-size",
        type=int,
        default=None,
        help=f"training window in tokens = max_position_embeddings (default {m.block_size})",
    )
    h.add_argument("--warmup", type=int, default=None, help=f"warmup steps (default {q.warmup})")


GPT_ONLY = ("dropout", "corpus", "pack", "pe", "track_grads")  # the destinations of the group's flags
SUBWORD_ONLY = ("layers", "d_model", "heads", "kv_heads", "d_ff", "block_size", "warmup")


def run(args: argparse.Namespace) -> int:
    """Dispatch on ``--arch``, refusing flags that belong to the other architecture."""
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        import torch

        torch.set_num_threads(args.threads)
    other, owner = (GPT_ONLY, "gpt") if args.arch != "gpt" else (SUBWORD_ONLY, "llama/qwen2")
    used = ["--" + name.replace("_", "-") for name in other if getattr(args, name) not in (None, False)]
    if used:
        verb = "is" if len(used) == 1 else "are"
        raise ValueError(f"{', '.join(used)} {verb} for --arch {owner} only, not --arch {args.arch}")
    progress = not args.no_progress and sys.stderr.isatty()
    s = _run_gpt(args, progress) if args.arch == "gpt" else _run_subword(args, progress)
    info(_table(s) if args.arch == "gpt" else _subword_table(s))
    if args.json:
        emit_json(s)
    return 0


def _run_gpt(args: argparse.Namespace, progress: bool) -> dict:
    """Train the char GPT, save it atomically; its summary."""
    from ..corpus import CharTokenizer, load_corpus
    from ..corpus.tang import DEFAULT_POEMS
    from ..model.checkpoint import META, is_checkpoint, save_checkpoint
    from ..model.config import GPTConfig
    from ..model.train import TrainConfig, quick_train_config, train

    out: Path = args.out
    check_target_dir(out, META, "a genprobe checkpoint")
    vocab = 1200 if args.vocab is None else args.vocab
    if vocab < 1:
        raise ValueError(f"--vocab must be >= 1, got {vocab}")
    base = quick_train_config(args.seed) if args.quick else TrainConfig(seed=args.seed)
    tc = _override(base, steps=args.steps, batch_size=args.batch_size, lr=args.lr, dropout=args.dropout, pack=args.pack)
    pe = args.pe or "learned"
    corpus = load_corpus(args.corpus, poems=DEFAULT_POEMS if args.poems is None else args.poems)
    tok = CharTokenizer.from_text(corpus.text, vocab)
    cfg = GPTConfig(vocab_size=tok.vocab_size, pos_encoding=pe, dropout=tc.dropout)
    cs = corpus.summary()
    info(
        f"corpus {cs['source']}: {cs['documents']:,} documents, {cs['chars']:,} chars "
        f"(train {cs['train_chars']:,} / val {cs['val_chars']:,}); vocabulary {tok.vocab_size:,} ids"
    )
    tracker = None
    if args.track_grads:
        from ..attention.gradients import QKVGradTracker  # lazy: optional diagnostics module

        tracker = QKVGradTracker()
    result = train(corpus, tok, cfg=cfg, tc=tc, progress=progress, on_backward=tracker)
    save_checkpoint(out, result.model, tok, result.summary)
    s = dict(result.summary, out=str(out), checkpoint=is_checkpoint(out), config=json_safe(cfg))
    if tracker is not None:
        s["grad_tracking"] = tracker.save(out)
    return s


def _override(base, **values):
    """``base`` with the given fields replaced where the value is not None (validated by the dataclass)."""
    from dataclasses import replace

    return replace(base, **{k: v for k, v in values.items() if v is not None})


def _run_subword(args: argparse.Namespace, progress: bool) -> dict:
    """Train BPE + a Llama/Qwen2 on the corpus split, write a transformers directory; its summary."""
    from ..corpus import bpe
    from ..corpus.tang import DEFAULT_SUBWORD_POEMS, bundled_documents, corpus_split, split_texts
    from ..model import hf_train
    from ..model.hf_train import SUMMARY_FILE, save_subword_dir

    check_target_dir(args.out, SUMMARY_FILE, "a genprobe-trained model")
    if args.vocab is not None and not bpe.MIN_VOCAB <= args.vocab <= bpe.MAX_VOCAB:
        raise ValueError(
            f"--vocab must be in [{bpe.MIN_VOCAB}, {bpe.MAX_VOCAB}] for a byte-level BPE "
            f"(256 bytes + <|endoftext|> + merges), got {args.vocab}"
        )
    docs = bundled_documents()
    poems = args.poems if args.poems is not None else (2000 if args.quick else DEFAULT_SUBWORD_POEMS)
    if not 1 <= poems < len(docs):
        raise ValueError(
            f"--poems must be in [1, {len(docs) - 1}] (the bundled corpus has {len(docs):,} poems "
            f"and some must stay held out), got {poems}"
        )
    base_cfg = hf_train.quick_model_config(args.arch) if args.quick else hf_train.SubwordModelConfig(arch=args.arch)
    cfg = _override(
        base_cfg,
        arch=args.arch,
        vocab_size=args.vocab,
        n_layer=args.layers,
        d_model=args.d_model,
        n_head=args.heads,
        n_kv_head=args.kv_heads,
        d_ff=args.d_ff,
        block_size=args.block_size,
    )
    base_tc = hf_train.quick_train_config(args.seed) if args.quick else hf_train.default_train_config(args.seed)
    tc = _override(base_tc, steps=args.steps, batch_size=args.batch_size, lr=args.lr, warmup=args.warmup)
    split = corpus_split(docs, poems)
    texts = split_texts(docs, split)
    info(
        f"split: train {len(texts.train):,} poems (documents {[[r.start, r.stop] for r in split.subword_train]}, "
        f"{texts.duplicates_dropped} duplicates of protected poems dropped); char-GPT validation text "
        f"{len(texts.char_val_text):,} chars; held out {len(texts.heldout):,} poems from {split.heldout_start:,}"
    )
    result = hf_train.train_subword(
        texts,
        split,
        cfg,
        tc,
        progress=progress,
        heldout_docs=100 if args.quick else hf_train.HELDOUT_EVAL_DOCS,
        samples=1 if args.quick else 4,
    )
    save_subword_dir(args.out, result.model, result.tokenizer, result.summary)
    return dict(result.summary, out=str(args.out))


def _subword_table(s: dict) -> str:
    """Losses in nats/token beside bits per character, the measure comparable with the char GPT."""
    return "\n".join(
        [
            f"{'':22}{'nats/token':>11}{'bits/char':>11}",
            f"{'train (last steps)':22}{s['train_loss']:>11.4f}",
            f"{'char-GPT val text':22}{s['val_loss']:>11.4f}{s['val_bits_per_char']:>11.4f}"
            f"   (window 64: {s['val_bits_per_char_window64']:.4f} bits/char)",
            f"{'held-out poems':22}{s['heldout_loss']:>11.4f}{s['heldout_bits_per_char']:>11.4f}",
            f"{s['arch']} {s['parameters']:,} parameters, {s['chars_per_token']:.3f} chars/token, "
            f"{s['seconds']:.1f} s ({s['cpu_seconds']:.1f} s CPU), model: {s['out']}",
        ]
    )


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
