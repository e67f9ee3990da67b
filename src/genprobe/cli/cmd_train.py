"""Train a reference model: the character-level GPT, or a Llama/Qwen2 with a BPE tokenizer.

Corpus → tokenizer → reference model → directory. Train the reference GPT (--arch gpt, a genprobe checkpoint) or a
small Llama/Qwen2 with a byte-level BPE (--arch llama|qwen2, a transformers directory, trained on the corpus split of
genprobe.corpus.tang.corpus_split) on the bundled Tang poems, and save it to --out. Progress goes to stderr; --json
prints the summary on stdout.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .._io import check_target_dir, json_safe
from ._common import Column, Command, check_min, emit_json, fmt, info, option, show_progress, table

SUBWORD_SHAPE = (  # (flag, SubwordModelConfig field, help): the --arch llama / qwen2 model's shape
    ("--layers", "n_layer", "transformer layers"),
    ("--d-model", "d_model", "hidden size"),
    ("--heads", "n_head", "query heads"),
    ("--kv-heads", "n_kv_head", "key/value heads, divides --heads"),
    ("--d-ff", "d_ff", "SwiGLU width"),
    ("--block-size", "block_size", "training window in tokens = max_position_embeddings"),
)


def options(p: argparse.ArgumentParser) -> None:
    from ..corpus.tang import DEFAULT_POEMS, DEFAULT_SUBWORD_POEMS
    from ..model.config import POS_ENCODINGS
    from ..model.hf_train import ARCHS, SubwordModelConfig, default_train_config
    from ..model.train import TrainConfig

    # the defaults the help texts quote: the char GPT's, the subword recipe's, the subword model's shape
    d, q, m = TrainConfig(), default_train_config(), SubwordModelConfig()
    option(p, "--arch", "gpt", "gpt: character GPT; llama/qwen2: transformers model + BPE", choices=("gpt", *ARCHS))
    option(p, "--out", required=True, type=Path, metavar="DIR", help="directory to write")
    poems = (
        f"gpt: first N poems / JSONL lines (default {DEFAULT_POEMS}); llama/qwen2: train on poems before N except the "
        f"char GPT's validation poems, hold out the rest (default {DEFAULT_SUBWORD_POEMS:,})"
    )
    option(p, "--poems", type=int, help=poems)
    vocab = f"gpt: characters in the vocabulary (default 1200); llama/qwen2: BPE vocabulary (default {m.vocab_size})"
    option(p, "--vocab", type=int, help=vocab)
    option(p, "--steps", type=int, help=f"optimizer steps (default gpt {d.steps}, llama/qwen2 {q.steps})")
    option(p, "--batch-size", type=int, help=f"rows per step (default gpt {d.batch_size}, llama/qwen2 {q.batch_size})")
    option(p, "--lr", type=float, help=f"peak learning rate (default gpt {d.lr}, llama/qwen2 {q.lr})")
    option(p, "--seed", d.seed, "random seed")
    option(p, "--threads", type=int, help="torch CPU threads (default: torch's choice)")
    option(p, "--quick", False, "seconds-long recipe for tests and smoke runs (explicit flags win)")
    option(p, "--no-progress", False, "no progress bar")
    g = p.add_argument_group("--arch gpt only")
    option(g, "--dropout", type=float, help=f"dropout probability while training (default {d.dropout})")
    option(g, "--corpus", type=Path, help="your own UTF-8 .txt or .jsonl(.xz) file")
    option(g, "--pack", False, "pack whole documents per row (block-diagonal causal mask)")
    option(g, "--pe", choices=POS_ENCODINGS, help="position encoding (default learned)")
    option(g, "--track-grads", False, "record Q/K/V gradient norms per step into --out")
    h = p.add_argument_group("--arch llama / qwen2 only")
    for flag, name, help in SUBWORD_SHAPE:
        option(h, flag, type=int, dest=name, help=f"{help} (default {getattr(m, name)})")
    option(h, "--warmup", type=int, help=f"warmup steps (default {q.warmup})")


GPT_ONLY = ("dropout", "corpus", "pack", "pe", "track_grads")  # the destinations of each group's flags
SUBWORD_ONLY = (*(name for _, name, _ in SUBWORD_SHAPE), "warmup")


def run(args: argparse.Namespace) -> int:
    """Dispatch on ``--arch``, refusing flags that belong to the other architecture."""
    check_min(args, threads=1)
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    other, owner = (GPT_ONLY, "gpt") if args.arch != "gpt" else (SUBWORD_ONLY, "llama/qwen2")
    flag = {name: flag for flag, name, _ in SUBWORD_SHAPE}  # the flags not spelled as their destination
    used = [flag.get(n, "--" + n.replace("_", "-")) for n in other if getattr(args, n) not in (None, False)]
    if used:
        verb = "is" if len(used) == 1 else "are"
        raise ValueError(f"{', '.join(used)} {verb} for --arch {owner} only, not --arch {args.arch}")
    progress = show_progress(args)
    s = _run_gpt(args, progress) if args.arch == "gpt" else _run_subword(args, progress)
    info(_summary(s, args.arch == "gpt"))
    if args.json:
        emit_json(s)
    return 0


def _run_gpt(args: argparse.Namespace, progress: bool) -> dict:
    """Train the char GPT, save it atomically; its summary."""
    from ..corpus.tang import DEFAULT_POEMS, load_corpus
    from ..corpus.tokenizer import CharTokenizer
    from ..model.checkpoint import META, is_checkpoint, save_checkpoint
    from ..model.config import GPTConfig
    from ..model.train import TrainConfig, quick_train_config, train

    out: Path = args.out
    check_target_dir(out, META, "a genprobe checkpoint")
    check_min(args, vocab=1)
    vocab = 1200 if args.vocab is None else args.vocab
    base = quick_train_config(args.seed) if args.quick else TrainConfig(seed=args.seed)
    tc = _override(base, args)
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


def _override(base, args: argparse.Namespace, **values):
    """``base`` with each field replaced by the option named like it (or ``values``) where not None."""
    from dataclasses import fields, replace

    given = {f.name: getattr(args, f.name, None) for f in fields(base)} | values
    return replace(base, **{k: v for k, v in given.items() if v is not None})


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
    cfg = _override(base_cfg, args, vocab_size=args.vocab)  # --arch and the shape flags are named like its fields
    base_tc = hf_train.quick_train_config(args.seed) if args.quick else hf_train.default_train_config(args.seed)
    tc = _override(base_tc, args)
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


def _summary(s: dict, gpt: bool) -> str:
    """The losses as a table: the char GPT's train and validation loss beside the unigram baseline (the overfitting
    check); the subword model's nats/token beside bits per character (the measure comparable with the char GPT)."""
    if gpt:
        gap = f"(val is {s['unigram_ce'] - s['val_loss']:.3f} nats below it)"
        heads, rows = ("train", "val"), [("loss (nats)", s["train_loss"], s["val_loss"], "")]
        rows.append(("unigram CE", None, s["unigram_ce"], gap))
        tail = [
            f"coverage {s['coverage']:.2%} of corpus characters, <unk> share {s['unk_share']:.2%}",
            f"parameters {s['parameters']:,}, {s['seconds']:.1f} s, checkpoint: {s['out']}",
        ]
    else:
        heads, rows = ("nats/token", "bits/char"), [("train (last steps)", s["train_loss"], None, "")]
        window = f"(window 64: {s['val_bits_per_char_window64']:.4f} bits/char)"
        rows.append(("char-GPT val text", s["val_loss"], s["val_bits_per_char"], window))
        rows.append(("held-out poems", s["heldout_loss"], s["heldout_bits_per_char"], ""))
        tail = [
            f"{s['arch']} {s['parameters']:,} parameters, {s['chars_per_token']:.3f} chars/token, "
            f"{s['seconds']:.1f} s ({s['cpu_seconds']:.1f} s CPU), model: {s['out']}"
        ]
    loss = lambda i: lambda r: fmt(r[i], ".4f", "")  # noqa: E731
    columns: list[Column] = [("", -18, lambda r: r[0]), (heads[0], 10, loss(1)), (heads[1], 10, loss(2))]
    return "\n".join([table([*columns, ("", -1, lambda r: r[3])], rows), *tail])


COMMANDS = (Command("train", __doc__, run, options),)
