"""Trainer of the subword reference model: a small ``LlamaForCausalLM`` (or ``Qwen2ForCausalLM``) + byte-level BPE
(``corpus.bpe``: Qwen2's own pipeline for ``--arch qwen2``), trained with the char trainer's :func:`fit` and
:func:`window_loss` on the poems of the one corpus split (``genprobe.corpus.tang``: never the char GPT's validation
poems nor the held-out loop prompts) joined by ``<|endoftext|>``, so the model learns where a poem ends.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from .._io import atomic_write_json, check_target_dir, json_safe, read_json_object, replacing
from ..corpus import bpe
from ..corpus.tang import CorpusSplit, SplitTexts
from .bpc import subword_bits_per_char
from .hf import quiet_transformers
from .train import Fitted, TrainConfig, TrainResult, fit, window_loss

if TYPE_CHECKING:  # tokenizers and transformers are imported lazily at run time
    from tokenizers import Tokenizer
    from transformers import PreTrainedModel


ARCHS = ("llama", "qwen2")
TOKENIZER_STYLE = {"llama": "gpt2", "qwen2": "qwen2"}  # the BPE pipeline AutoTokenizer runs for each arch
HELDOUT_EVAL_DOCS = 500  # held-out poems scored at the end (a second validation set, never trained on)
SUMMARY_FILE = "genprobe_training.json"
SUMMARY_FORMAT = "genprobe-subword-training-v1"


@dataclass(frozen=True)
class SubwordModelConfig:
    """Shape of the subword model; defaults = the calibrated reference (1.26M parameters; docs/own-model.md)."""

    arch: str = "llama"
    vocab_size: int = 4096  # BPE vocabulary: 256 bytes + <|endoftext|> + 3,839 merges
    n_layer: int = 4
    d_model: int = 128
    n_head: int = 4
    n_kv_head: int = 2  # grouped-query attention: 2 query heads share each key/value head
    d_ff: int = 352  # SwiGLU width (≈ 8/3 · d_model rounded up to a multiple of 32, as in Llama)
    block_size: int = 256  # training window in tokens = max_position_embeddings
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(f"arch must be one of {ARCHS}, got {self.arch!r}")
        bpe.check_vocab_size(self.vocab_size)
        for name in ("n_layer", "d_model", "n_head", "n_kv_head", "d_ff", "block_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"SubwordModelConfig.{name} must be a positive integer, got {v!r}")
        if self.d_model % self.n_head or (self.d_model // self.n_head) % 2:
            raise ValueError(f"d_model ({self.d_model}) must split into {self.n_head} heads of even size (RoPE)")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"n_head ({self.n_head}) must be a multiple of n_kv_head ({self.n_kv_head})")
        if self.block_size < 8:
            raise ValueError(f"block_size must be >= 8, got {self.block_size}")


def default_train_config(seed: int = 0) -> TrainConfig:
    """The calibrated recipe of ``genprobe train --arch llama|qwen2`` (docs/own-model.md): 1,900 steps × 8 × 256
    tokens ≈ 3.9M tokens (≈ 1.3 epochs of the 3M-token stream)."""
    return TrainConfig(steps=1900, batch_size=8, lr=3e-3, warmup=150, dropout=0.0, seed=seed, eval_every=300)


def quick_model_config(arch: str = "llama") -> SubwordModelConfig:
    """A tiny shape for tests and ``--quick`` (seconds)."""
    return SubwordModelConfig(
        arch=arch, vocab_size=512, n_layer=2, d_model=64, n_head=4, n_kv_head=2, d_ff=128, block_size=64
    )


def quick_train_config(seed: int = 0) -> TrainConfig:
    """A few optimiser steps for tests and ``--quick``."""
    return TrainConfig(steps=60, batch_size=8, lr=3e-3, warmup=10, dropout=0.0, seed=seed, eval_every=0)


def train_subword(
    texts: SplitTexts,
    split: CorpusSplit,
    cfg: SubwordModelConfig | None = None,
    tc: TrainConfig | None = None,
    progress: bool = True,
    heldout_docs: int = HELDOUT_EVAL_DOCS,
    samples: int = 4,
) -> TrainResult[PreTrainedModel, Tokenizer]:  # the tokenizer: wrap with bpe.to_hf_tokenizer to save
    """Train BPE on ``texts.train``, then a freshly initialised transformers causal LM of ``cfg`` (float32, SDPA
    attention, tied embeddings) on its ``<|endoftext|>``-joined stream (validated on the char GPT's validation text).

    The summary: losses in nats/token, bits/char on the char GPT's validation text, chars/token, and greedy samples
    of ``<|endoftext|>`` + the opening of ``samples`` held-out poems by ``transformers.generate``: as trained (stops at
    end-of-text) and with end-of-text suppressed for exactly 60 new tokens (how loop studies run it)."""
    cfg, tc = cfg or SubwordModelConfig(), tc or default_train_config()
    t0, c0 = time.time(), time.process_time()
    tok: Tokenizer = bpe.train_bpe(texts.train, cfg.vocab_size, TOKENIZER_STYLE[cfg.arch])
    if tok.get_vocab_size() != cfg.vocab_size:  # too little text for the requested number of merges
        raise ValueError(
            f"BPE reached only {tok.get_vocab_size()} tokens of the requested {cfg.vocab_size}: "
            f"the {len(texts.train)} training documents hold too few repeated pairs"
        )
    t_bpe = time.time() - t0
    train_ids = torch.tensor(bpe.stream_ids(tok, texts.train), dtype=torch.long)  # documents joined by <|endoftext|>
    model = _fresh_model(cfg, bpe.eos_id(tok), tc.seed)
    gen, t_loop = torch.Generator().manual_seed(tc.seed), time.time()
    fitted = fit(
        model,
        lambda: window_loss(lambda x: model(input_ids=x).logits, train_ids, cfg.block_size, tc.batch_size, gen),
        tc,
        progress=progress,
        val_loss=lambda: subword_bits_per_char(model, tok, texts.char_val_documents, cfg.block_size).nats_per_token,
        validate_last=False,  # the summary scores the end on the same text
    )
    loop_seconds = time.time() - t_loop
    model.eval()  # type: ignore[no-untyped-call]  # transformers' eval() override is unannotated
    summary = _summary(model, tok, texts, split, cfg, tc, fitted, len(train_ids), heldout_docs, samples)
    summary.update(
        initial_loss=round(fitted.losses[0], 4),
        seconds=round(time.time() - t0, 1),
        cpu_seconds=round(time.process_time() - c0, 1),
        threads=torch.get_num_threads(),
        bpe_seconds=round(t_bpe, 1),
        train_loop_seconds=round(loop_seconds, 1),
        steps_per_second=round(tc.steps / loop_seconds, 3),
    )
    return TrainResult(model=model, tokenizer=tok, summary=summary)


def _fresh_model(cfg: SubwordModelConfig, eos: int, seed: int) -> PreTrainedModel:
    """A seeded, untrained float32 SDPA causal LM of ``cfg`` whose begin, end and pad token are all ``eos``."""
    from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig, Qwen2Config

    hf_cfg = {"llama": LlamaConfig, "qwen2": Qwen2Config}[cfg.arch](
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.n_layer,
        num_attention_heads=cfg.n_head,
        num_key_value_heads=cfg.n_kv_head,
        max_position_embeddings=cfg.block_size,
        rope_theta=cfg.rope_theta,
        tie_word_embeddings=True,  # as Qwen2-0.5B / Llama-3.2-1B: at this size the embedding is a third of the weights
        bos_token_id=eos,  # every training document is preceded by <|endoftext|>
        eos_token_id=eos,
        pad_token_id=eos,
    )
    torch.manual_seed(seed)
    # from_config and GenerationConfig take unannotated **kwargs in transformers: stub gaps.
    model: PreTrainedModel = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
        hf_cfg, attn_implementation="sdpa", dtype=torch.float32
    )
    model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]
        bos_token_id=eos, eos_token_id=eos, pad_token_id=eos
    )
    return model


def _summary(
    model: PreTrainedModel,
    tok: Tokenizer,
    texts: SplitTexts,
    split: CorpusSplit,
    cfg: SubwordModelConfig,
    tc: TrainConfig,
    fitted: Fitted,
    train_tokens: int,
    heldout_docs: int,
    samples: int,
) -> dict[str, Any]:
    """The trained model's scores on the validation and held-out poems, its greedy samples and the run's settings."""
    val = subword_bits_per_char(model, tok, texts.char_val_documents, cfg.block_size)
    # the char GPT's context length (block_size 64): how much of the gap is context, not modelling
    val_short = val if cfg.block_size == 64 else subword_bits_per_char(model, tok, texts.char_val_documents, 64)
    heldout = subword_bits_per_char(model, tok, texts.heldout[:heldout_docs], cfg.block_size)
    train_loss = round(fitted.ema, 4)  # EMA of the last steps' batch losses (nats/token)
    history = [*fitted.history, {"step": tc.steps, "train_loss": train_loss, "val_loss": round(val.nats_per_token, 4)}]
    tokens_seen = tc.steps * tc.batch_size * cfg.block_size
    return {
        "arch": cfg.arch,
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_loss": train_loss,
        "val_loss": round(val.nats_per_token, 4),  # nats/token on the char GPT's validation poems
        "val_bits_per_char": round(val.bits_per_char, 4),
        "val_bits_per_char_window64": round(val_short.bits_per_char, 4),
        "heldout_loss": round(heldout.nats_per_token, 4),  # first heldout_docs held-out poems
        "heldout_bits_per_char": round(heldout.bits_per_char, 4),
        "chars_per_token": _chars_per_token(tok, texts.train),  # training text
        "val_chars_per_token": _chars_per_token(tok, texts.char_val_documents),
        "heldout_chars_per_token": _chars_per_token(tok, texts.heldout[:heldout_docs]),
        "tokenizer_style": TOKENIZER_STYLE[cfg.arch],
        "eos_token_id": bpe.eos_id(tok),
        "train_documents": len(texts.train),
        "train_tokens": train_tokens,  # the training documents joined by <|endoftext|>
        "tokens_seen": tokens_seen,
        "epochs": round(tokens_seen / train_tokens, 3),
        "duplicates_dropped": texts.duplicates_dropped,
        "split": json_safe(split),
        "val": json_safe(val),
        "val_window64": json_safe(val_short),
        "heldout": json_safe(heldout),
        "model_config": json_safe(cfg),
        "train_config": {k: v for k, v in json_safe(tc).items() if k not in ("dropout", "pack")},
        "history": history,
        "torch": torch.__version__,
        "bits_per_char_definition": "-log2 P(text)/chars over <eos>-joined poems, each target once, "
        "sliding window of block_size tokens with stride block_size/2 (document ends are scored too)",
        "samples": _greedy_samples(model, tok, [d[:5] for d in texts.heldout[:samples]]),
    }


def _greedy_samples(model: PreTrainedModel, tok: Tokenizer, prompts: list[str]) -> list[dict[str, Any]]:
    """Greedy continuations of ``<|endoftext|>`` + each prompt, as trained and with end-of-text suppressed."""
    eos, greedy = bpe.eos_id(tok), []
    kw: dict[str, Any] = dict(max_new_tokens=60, do_sample=False, eos_token_id=eos, pad_token_id=eos)
    # transformers' own annotation of generate's ``self`` differs between 5.19 and 5.24: call it untyped
    generate = cast(Any, model).generate
    with torch.no_grad():
        for text in prompts:
            x = torch.tensor([[eos, *tok.encode(text).ids]])
            stop = generate(x, **kw)[0, x.shape[1] :].tolist()
            full = generate(x, suppress_tokens=[eos], min_new_tokens=60, **kw)[0, x.shape[1] :].tolist()
            stopped = tok.decode([t for t in stop if t != eos])
            greedy.append({"prompt": text, "greedy": stopped, "greedy_no_eos": tok.decode(full)})
    return greedy


def _chars_per_token(tok: Tokenizer, docs: list[str]) -> float:
    n = sum(len(i) for i in bpe.encode_batch(tok, docs))
    return round(sum(len(d) for d in docs) / max(1, n), 4)


def save_subword_dir(
    out: str | os.PathLike[str], model: PreTrainedModel, tok: Tokenizer, summary: dict[str, Any]
) -> Path:
    """Write ``model`` + BPE ``tok`` + ``summary`` to ``out`` (replacing an earlier run there): ``config.json``,
    ``generation_config.json``, ``model.safetensors``, ``tokenizer.json`` + ``tokenizer_config.json`` and
    :data:`SUMMARY_FILE`, assembled beside it and renamed into place."""
    out = Path(out)
    check_target_dir(out, SUMMARY_FILE, "a genprobe-trained model", "output")
    if tok.get_vocab_size() != model.config.vocab_size:
        raise ValueError(
            f"tokenizer has {tok.get_vocab_size()} ids but the model's vocab_size is {model.config.vocab_size}"
        )
    with replacing(out, directory=True) as tmp:
        with quiet_transformers():
            model.save_pretrained(tmp, safe_serialization=True)
        bpe.to_hf_tokenizer(tok, model.config.max_position_embeddings).save_pretrained(tmp)
        # transformers 5 writes ``TokenizersBackend``, a class transformers 4 does not know; ``PreTrainedTokenizerFast``
        # is that class in 4 and an alias of it in 5: both then load tokenizer.json as is
        tok_cfg = tmp / "tokenizer_config.json"
        atomic_write_json(tok_cfg, {**read_json_object(tok_cfg), "tokenizer_class": "PreTrainedTokenizerFast"})
        atomic_write_json(tmp / SUMMARY_FILE, {"format": SUMMARY_FORMAT, **summary})
    return out
