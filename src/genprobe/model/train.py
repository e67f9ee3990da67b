"""Trainer for the reference GPT: AdamW, linear warmup + cosine decay, seeded and deterministic on CPU."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, TypeVar

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .._io import json_safe
from ..corpus.tang import Corpus
from ..corpus.tokenizer import PAD_ID, CharTokenizer
from .bpc import eval_mode
from .config import GPTConfig
from .gpt import GPT, masked_cross_entropy, packed_positions


@dataclass
class TrainConfig:
    """Optimisation settings; defaults are the chapter's (lr 3e-3, warmup 100, cosine, 2,000 steps)."""

    steps: int = 2000
    batch_size: int = 64  # 64 × 64 tokens with dropout 0.1: how it was calibrated, docs/own-model.md
    dropout: float = 0.1  # used when train() builds the model itself (cfg=None)
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup: int = 100
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    seed: int = 0
    eval_every: int = 250
    pack: bool = False  # rows made of whole documents with a block-diagonal causal mask (the chapter's Eq. 3.16)

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError(f"steps and batch_size must be >= 1, got {self.steps}, {self.batch_size}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")


def lr_at(step: int, tc: TrainConfig) -> float:
    """Learning rate at ``step`` (0-based): linear warmup, then cosine down to ``min_lr_ratio``·lr."""
    if tc.warmup and step < tc.warmup:
        return tc.lr * (step + 1) / tc.warmup
    span = max(1, tc.steps - tc.warmup)
    progress = min(1.0, (step - tc.warmup) / span)
    return tc.lr * (tc.min_lr_ratio + (1 - tc.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def unigram_cross_entropy(train_ids: torch.Tensor, val_ids: torch.Tensor, vocab_size: int) -> float:
    """Cross-entropy (nats) on ``val_ids`` of "guess by character frequency" fit on ``train_ids`` (add-one)."""
    counts = torch.bincount(train_ids, minlength=vocab_size).double() + 1.0
    logp = (counts / counts.sum()).log()
    return float(-logp[val_ids].mean())


@torch.no_grad()
def position_losses(model: GPT, ids: torch.Tensor, length: int | None = None, batch_size: int = 64) -> torch.Tensor:
    """Mean next-token loss (nats, float64) at each of ``length`` positions (default: the model's block size), over
    ``ids`` cut into non-overlapping windows of ``length``: every target counted once."""
    T = length or model.cfg.block_size
    n = (len(ids) - 1) // T
    if n < 1:
        raise ValueError(f"need more than {T} tokens to evaluate, got {len(ids)}")
    x = ids[: n * T].view(n, T)
    y = ids[1 : n * T + 1].view(n, T)
    total = torch.zeros(T, dtype=torch.float64)
    with eval_mode(model):
        for i in range(0, n, batch_size):
            ce = F.cross_entropy(model(x[i : i + batch_size]).transpose(1, 2), y[i : i + batch_size], reduction="none")
            total += ce.double().sum(0)
    return total / n


def evaluate_loss(model: GPT, ids: torch.Tensor) -> float:
    """Mean next-token loss over ``ids`` cut into non-overlapping windows (:func:`position_losses`, averaged)."""
    return float(position_losses(model, ids).mean())


def window_loss(
    logits_of: Callable[[torch.Tensor], torch.Tensor], ids: torch.Tensor, T: int, B: int, gen: torch.Generator
) -> torch.Tensor:
    """Next-token loss of ``logits_of`` on ``B`` random windows of ``T`` tokens of ``ids`` (both trainers' batch)."""
    if len(ids) <= T + 1:
        raise ValueError(f"the training text has {len(ids)} tokens; a window of {T} needs more than {T + 1}")
    ix = torch.randint(0, len(ids) - T - 1, (B,), generator=gen).tolist()
    x, y = torch.stack([ids[i : i + T] for i in ix]), torch.stack([ids[i + 1 : i + T + 1] for i in ix])
    return masked_cross_entropy(logits_of(x), y)


@dataclass
class Fitted:
    """What :func:`fit` did: every step's loss, their exponential moving average (0.95: the smoothed train loss the
    summaries report) and ``{step, train_loss, val_loss, seconds}`` at each validation."""

    losses: list[float]
    ema: float
    history: list[dict[str, Any]]


def fit(
    model: torch.nn.Module,
    batch_loss: Callable[[], torch.Tensor],
    tc: TrainConfig,
    *,
    lr_of: Callable[[int], float] | None = None,
    progress: bool = False,
    on_backward: Callable[[int, Any], None] | None = None,
    val_loss: Callable[[], float] | None = None,
    validate_last: bool = True,
) -> Fitted:
    """The one training loop: ``tc.steps`` updates, each on a fresh ``batch_loss()``, gradients clipped at
    ``tc.grad_clip``, by AdamW at the learning rate ``lr_of(step)`` (default :func:`lr_at`).

    ``on_backward(step, model)`` sees the gradients before they are clipped and applied; ``val_loss()`` runs every
    ``tc.eval_every`` updates and after the last one (unless not ``validate_last``: the caller scores the end itself).
    """
    # AdamW with weight decay on matrices only (biases, norms and gains are not decayed)
    decay = [{"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": tc.weight_decay}]
    no_decay = [{"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(decay + no_decay, lr=tc.lr, betas=tc.betas)
    lr_of = lr_of or (lambda step: lr_at(step, tc))
    model.train()
    fitted, t0 = Fitted([], 0.0, []), time.time()
    bar = tqdm(range(tc.steps), desc="train", disable=not progress, dynamic_ncols=True)
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = lr_of(step)
        loss = batch_loss()
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]  # torch: Tensor.backward is unannotated
        if on_backward is not None:
            on_backward(step, model)
        if tc.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        opt.step()
        lv = float(loss.detach())
        fitted.ema = lv if not fitted.losses else 0.95 * fitted.ema + 0.05 * lv
        fitted.losses.append(lv)
        last = step == tc.steps - 1
        if val_loss is not None and (validate_last if last else tc.eval_every and (step + 1) % tc.eval_every == 0):
            vl, ema = val_loss(), fitted.ema
            row = {"step": step + 1, "train_loss": round(ema, 4), "val_loss": round(vl, 4)}
            fitted.history.append(row | {"seconds": round(time.time() - t0, 1)})
            bar.set_postfix(loss=f"{ema:.3f}", val=f"{vl:.3f}")
        elif step % 10 == 0:
            bar.set_postfix(loss=f"{fitted.ema:.3f}")
    return fitted


ModelT = TypeVar("ModelT")
TokenizerT = TypeVar("TokenizerT")


@dataclass
class TrainResult(Generic[ModelT, TokenizerT]):
    """What a training run produced: the model, its tokenizer and the run's summary."""

    model: ModelT
    tokenizer: TokenizerT
    summary: dict[str, Any] = field(default_factory=dict)


def _packed_loss(model: GPT, docs: list[torch.Tensor], T: int, B: int, gen: torch.Generator) -> torch.Tensor:
    """Loss on ``B`` rows of ``T`` tokens greedily packed with whole random ``docs`` (block-diagonal, pads unscored)."""
    x = torch.full((B, T), PAD_ID, dtype=torch.long)
    y = torch.full((B, T), PAD_ID, dtype=torch.long)
    doc = torch.full((B, T), -1, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.bool)
    for b in range(B):
        t, d = 0, 0
        while t < T - 1:
            seq = docs[int(torch.randint(0, len(docs), (1,), generator=gen))][: T + 1]
            n = min(len(seq) - 1, T - t)
            if n < 1:
                break
            x[b, t : t + n] = seq[:n]
            y[b, t : t + n] = seq[1 : n + 1]
            doc[b, t : t + n] = d
            mask[b, t : t + n] = True
            t, d = t + n, d + 1
        doc[b, t:] = d  # padding tail is its own "document"
    return masked_cross_entropy(model(x, positions=packed_positions(doc), document_ids=doc), y, mask)


def train(
    corpus: Corpus,
    tokenizer: CharTokenizer,
    cfg: GPTConfig | None = None,
    tc: TrainConfig | None = None,
    progress: bool = True,
    on_backward: Callable[[int, GPT], None] | None = None,
) -> TrainResult[GPT, CharTokenizer]:
    """Train a GPT on ``corpus``; ``on_backward(step, model)`` sees gradients before each update. Each batch is
    random windows of the text, or (``tc.pack``) rows packed with whole documents (block-diagonal mask)."""
    tc = tc or TrainConfig()
    cfg = cfg or GPTConfig(vocab_size=tokenizer.vocab_size, dropout=tc.dropout)
    if cfg.vocab_size != tokenizer.vocab_size:
        raise ValueError(f"config vocab_size {cfg.vocab_size} != tokenizer vocab_size {tokenizer.vocab_size}")
    torch.manual_seed(tc.seed)
    gen = torch.Generator().manual_seed(tc.seed)
    t0 = time.time()

    def encode(text: str) -> torch.Tensor:
        return torch.tensor(tokenizer.encode(text, warn=False), dtype=torch.long)

    train_ids, val_ids = encode(corpus.train), encode(corpus.val)
    docs: list[torch.Tensor] = []
    pos = 0  # tc.pack: the training text cut at document boundaries (documents under 2 tokens dropped)
    for d in corpus.documents if tc.pack else ():
        if pos >= len(corpus.train):
            break
        docs.append(encode(d[: len(corpus.train) - pos]))
        pos += len(d)
    docs = [d for d in docs if len(d) >= 2] or [train_ids]
    model = GPT(cfg)
    T, B = cfg.block_size, tc.batch_size

    def batch() -> torch.Tensor:
        return _packed_loss(model, docs, T, B, gen) if tc.pack else window_loss(model, train_ids, T, B, gen)

    fitted = fit(
        model, batch, tc, progress=progress, on_backward=on_backward, val_loss=lambda: evaluate_loss(model, val_ids)
    )
    model.eval()
    cov = tokenizer.coverage(corpus.text)  # the trained model's figures beside the unigram baseline and coverage
    summary = {
        "parameters": model.num_parameters(),
        "train_loss": round(evaluate_loss(model, train_ids), 4),
        "val_loss": round(evaluate_loss(model, val_ids), 4),
        "unigram_ce": round(unigram_cross_entropy(train_ids, val_ids, cfg.vocab_size), 4),
        "coverage": round(cov["coverage"], 4),
        "unk_share": round(cov["unk_share"], 4),
        "corpus": corpus.summary(),
        "train_config": json_safe(tc),
        "history": fitted.history,
        "seconds": round(time.time() - t0, 1),
        "torch": torch.__version__,
    }
    return TrainResult(model=model, tokenizer=tokenizer, summary=summary)


def quick_train_config(seed: int = 0) -> TrainConfig:
    """The reduced recipe used by ``genprobe case --quick`` and the test-suite's shared checkpoint."""
    return TrainConfig(steps=600, batch_size=32, dropout=0.0, seed=seed, eval_every=200)
