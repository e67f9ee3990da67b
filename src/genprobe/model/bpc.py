"""Bits per character: one measure that compares models whose tokenizers cut the same text differently.

``-log2 P(text) / len(text)``, each target token scored once with a sliding window (window ``W``, stride ``S``), as the
transformers perplexity guide evaluates fixed-length models. A subword model is scored on its own segmentation (an
upper bound). The char GPT's ``<unk>`` stands for ~8,000 rare characters, so the exact figure charges each ``<unk>``
target ``-log q(c)`` more, ``q`` an add-one unigram over the out-of-vocabulary characters of its training text.
"""

from __future__ import annotations

import contextlib
import math
from collections import Counter
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch
import torch.nn.functional as F

if TYPE_CHECKING:  # annotations only: bpc is imported by the trainers, and tokenizers/transformers are optional
    from tokenizers import Tokenizer

    from ..corpus.tokenizer import CharTokenizer
    from .gpt import GPT

LogitsFn = Callable[[torch.Tensor], torch.Tensor]  # (B, T) ids -> (B, T, V) logits


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """``model`` in eval mode (no dropout) for the block, its training flag restored after."""
    was = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was)


@torch.no_grad()
def sliding_nll(logits_fn: LogitsFn, ids: torch.Tensor, window: int, stride: int, batch_size: int = 16) -> torch.Tensor:
    """Per-target negative log-likelihood (nats, float64) of ``ids[1:]``, each target scored exactly once."""
    if window < 2 or not 1 <= stride <= window - 1:
        raise ValueError(f"need window >= 2 and 1 <= stride < window, got window={window}, stride={stride}")
    n = len(ids)
    if n < 2:
        raise ValueError(f"need at least 2 tokens to score, got {n}")
    nll = torch.full((n - 1,), float("nan"), dtype=torch.float64)
    # (begin, first scored target): window ids[begin:begin+window] scores targets first..begin+window-1
    spans, scored = [], 1
    for begin in range(0, n - 1, stride):
        end = min(begin + window, n)
        if end > scored:
            spans.append((begin, end, scored))
            scored = end
        if end == n:
            break
    full = [s for s in spans if s[1] - s[0] == window]
    groups = [full[i : i + batch_size] for i in range(0, len(full), batch_size)]
    groups += [[s] for s in spans if s[1] - s[0] != window]
    for group in groups:
        x = torch.stack([ids[b:e] for b, e, _ in group])
        logp = F.log_softmax(logits_fn(x).float(), dim=-1)
        for row, (b, e, first) in enumerate(group):
            tgt = ids[first:e]
            lp = logp[row, first - b - 1 : e - b - 1].gather(-1, tgt[:, None])[:, 0]
            nll[first - 1 : e - 1] = -lp.double()
    return nll


@dataclass
class BitsPerChar:
    """A model's score on one text: nats per token of its own tokenizer and bits per character."""

    nats: float  # total over scored targets
    tokens: int  # scored targets
    chars: int  # characters those targets cover
    window: int
    stride: int
    nats_per_token: float
    bits_per_char: float
    unk_targets: int = 0  # char GPT only: targets that were <unk>
    bits_per_char_unk_as_symbol: float | None = None  # char GPT only: <unk> scored as if it were a character

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (floats rounded)."""
        return {k: (round(v, 5) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def _score(nll: torch.Tensor, chars: int, window: int, stride: int, extra: float = 0.0, **char_gpt: Any) -> BitsPerChar:
    """The figures of per-target ``nll`` over ``chars`` characters, ``extra`` nats added to the total (``<unk>``)."""
    total = float(nll.sum()) + extra
    per_token = float(nll.sum()) / len(nll)
    return BitsPerChar(total, len(nll), chars, window, stride, per_token, total / math.log(2) / chars, **char_gpt)


def subword_bits_per_char(model: torch.nn.Module, tok: Tokenizer, documents: list[str], window: int) -> BitsPerChar:
    """Score a transformers causal LM on ``<eos> d0 <eos> d1 ... <eos>`` (stride ``window // 2``): every text token
    and every document end is a target (so it also pays for knowing where poems end); chars = sum of len(d)."""
    from ..corpus.bpe import stream_ids

    ids = torch.tensor(stream_ids(tok, documents), dtype=torch.long)
    stride = max(1, window // 2)
    with eval_mode(model):
        nll = sliding_nll(lambda x: model(input_ids=x).logits, ids, window, stride)
    return _score(nll, sum(len(d) for d in documents), window, stride)


def oov_unigram_cost(tokenizer: CharTokenizer, train_text: str, alphabet: set[str]) -> dict[str, float]:
    """``-ln q(c)`` for each character of ``alphabet`` outside the char vocabulary (add-one over ``train_text``)."""
    oov = sorted(c for c in alphabet if c not in tokenizer.stoi)
    counts = Counter(c for c in train_text if c not in tokenizer.stoi)
    total = sum(counts[c] for c in oov) + len(oov)
    return {c: -math.log((counts[c] + 1) / total) for c in oov}


def char_gpt_bits_per_char(
    model: GPT,
    tokenizer: CharTokenizer,
    text: str,
    oov_cost: dict[str, float],
    window: int | None = None,
    stride: int | None = None,
) -> BitsPerChar:
    """Score the char GPT on ``text``; ``<unk>`` targets are charged ``oov_cost[c]`` more (see module doc)."""
    res = tokenizer.encode_with_report(text)
    ids = torch.tensor(res.ids, dtype=torch.long)
    window = window or model.cfg.block_size
    stride = max(1, window // 2) if stride is None else stride
    with eval_mode(model):
        nll = sliding_nll(model, ids, window, stride)
    unk = [p for p in res.unknown_positions if p >= 1]  # position 0 is context only, never a target
    missing = sorted({text[p] for p in unk if text[p] not in oov_cost})
    if missing:
        raise ValueError(f"oov_cost has no entry for {len(missing)} <unk> character(s), e.g. {missing[:5]}")
    extra = sum(oov_cost[text[p]] for p in unk)
    raw = float(nll.sum()) / math.log(2) / (len(text) - 1)
    return _score(nll, len(text) - 1, window, stride, extra, unk_targets=len(unk), bits_per_char_unk_as_symbol=raw)


def char_gpt_reference(model: GPT, tokenizer: CharTokenizer) -> BitsPerChar:
    """The char GPT on its own validation text (default corpus), ``<unk>`` priced by the bundled corpus's
    out-of-vocabulary characters — the figure to set beside a subword model's ``val_bits_per_char``."""
    from ..corpus.tang import bundled_documents, load_corpus

    corpus = load_corpus()
    alphabet = set("".join(bundled_documents()))
    cost = oov_unigram_cost(tokenizer, corpus.train, alphabet)
    return char_gpt_bits_per_char(model, tokenizer, corpus.val, cost)
