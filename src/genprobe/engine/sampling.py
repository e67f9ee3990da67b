"""The sampler chain: pure functions of logits with validated parameters and an explicit order.

Stages (each maps logits (B, V) → logits (B, V); a removed token gets ``-inf``, never 0 — a 0 is a
legal logit whose probability is not 0, seed §3.10.4):

* **adjustments** — ban list, repetition penalty (CTRL/HF), presence/frequency penalties (vLLM),
  no-repeat-n-gram (HF). They come first in every order.
* **truncation** — top-k, top-p (keeps the token that crosses p), min-p.
* **temperature** — divide logits by τ.

``order`` decides where temperature sits relative to truncation (seed §3.5.5, the order trap):

==================  ===========================================================
``trunc_then_temp`` truncation on the τ=1 distribution (top-k → top-p → min-p), then τ on the
                    survivors — the kept set does not depend on τ (the seed's default)
``temp_then_trunc`` τ first, then top-k → top-p → min-p
``hf``              temperature → top-k → top-p → min-p (transformers' warper order)
``vllm``            temperature → min-p → top-k → top-p
``llama.cpp``       top-k → top-p → min-p → temperature
==================  ===========================================================

Greedy is its own path: argmax of the adjusted logits (bans and penalties apply; truncation and
temperature cannot change an argmax). It is never emulated with τ≈0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Sequence

import torch

NEG_INF = float("-inf")

# Stage sequences per order; "temp" = temperature, the rest are truncations.
ORDERS: dict[str, tuple[str, ...]] = {
    "trunc_then_temp": ("top_k", "top_p", "min_p", "temp"),
    "temp_then_trunc": ("temp", "top_k", "top_p", "min_p"),
    "hf": ("temp", "top_k", "top_p", "min_p"),
    "vllm": ("temp", "min_p", "top_k", "top_p"),
    "llama.cpp": ("top_k", "top_p", "min_p", "temp"),
}


@dataclass(frozen=True)
class SamplerConfig:
    """Validated sampler parameters. ``top_k`` 0/None, ``top_p`` None/1.0, ``min_p`` None/0 mean "off"."""

    greedy: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    ban_ids: tuple[int, ...] = field(default=())
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    no_repeat_ngram: int = 0
    order: str = "trunc_then_temp"

    def __post_init__(self) -> None:
        object.__setattr__(self, "ban_ids", tuple(int(i) for i in self.ban_ids))
        t = self.temperature
        if not isinstance(t, (int, float)) or not math.isfinite(t):
            raise ValueError(f"temperature must be a finite number, got {t!r}")
        if not self.greedy and t <= 0:
            raise ValueError(
                f"temperature must be > 0 when sampling, got {t}; for deterministic decoding use greedy=True "
                "(an explicit argmax), not temperature≈0"
            )
        if self.top_k is not None and (int(self.top_k) != self.top_k or self.top_k < 0):
            raise ValueError(f"top_k must be an integer >= 0 (0 or None = off), got {self.top_k!r}")
        if self.top_p is not None and not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1] (1 or None = off), got {self.top_p!r}")
        if self.min_p is not None and not (0.0 <= self.min_p <= 1.0):
            raise ValueError(f"min_p must be in [0, 1] (0 or None = off), got {self.min_p!r}")
        if any(i < 0 for i in self.ban_ids):
            raise ValueError(f"ban_ids must be token ids >= 0, got {list(self.ban_ids)}")
        rp = self.repetition_penalty
        if not math.isfinite(rp) or rp <= 0:
            raise ValueError(f"repetition_penalty must be > 0 (1 = off), got {rp!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not math.isfinite(v):
                raise ValueError(f"{name} must be finite, got {v!r}")
        if int(self.no_repeat_ngram) != self.no_repeat_ngram or self.no_repeat_ngram < 0:
            raise ValueError(f"no_repeat_ngram must be an integer >= 0 (0 = off), got {self.no_repeat_ngram!r}")
        if self.order not in ORDERS:
            raise ValueError(f"unknown sampler order {self.order!r}; choose one of {sorted(ORDERS)}")

    # ---- what is active ------------------------------------------------------------------
    @property
    def uses_history(self) -> bool:
        """True when some stage reads the token history (penalties, no-repeat-n-gram)."""
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.no_repeat_ngram > 0
        )

    @property
    def is_identity(self) -> bool:
        """True when processing cannot change the outcome (plain greedy / plain τ=1 sampling)."""
        if self.uses_history or self.ban_ids:
            return False
        return self.greedy or (self.temperature == 1.0 and not self._truncates)

    @property
    def _truncates(self) -> bool:
        return bool(self.top_k) or (self.top_p is not None and self.top_p < 1.0) or bool(self.min_p)

    def to_dict(self) -> dict:
        """Plain-JSON form."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}  # asdict() deep-copies: slow per call
        d["ban_ids"] = list(self.ban_ids)
        return d


# ---- adjustments (applied first in every order) -------------------------------------------
def _history_counts(history: torch.Tensor, V: int) -> torch.Tensor:
    """(B, V) float counts of each token in ``history``; entries < 0 (padding) are ignored."""
    B = history.shape[0]
    idx = torch.where(history >= 0, history, torch.full_like(history, V))
    counts = torch.zeros(B, V + 1, dtype=torch.float32, device=history.device)
    counts.scatter_add_(1, idx, torch.ones_like(idx, dtype=torch.float32))
    return counts[:, :V]


def apply_repetition_penalty(logits: torch.Tensor, counts: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL/HF: for tokens already seen, positive logits are divided by ``penalty``, negative multiplied."""
    seen = counts > 0
    pen = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, pen, logits)


def apply_presence_frequency(logits: torch.Tensor, counts: torch.Tensor, presence: float, frequency: float) -> torch.Tensor:
    """vLLM: subtract ``presence * 1[count > 0] + frequency * count``."""
    return logits - presence * (counts > 0).to(logits.dtype) - frequency * counts.to(logits.dtype)


def no_repeat_ngram_mask(history: torch.Tensor, n: int, V: int) -> torch.Tensor:
    """(B, V) bool: tokens that would complete an n-gram already present in ``history`` (HF semantics).

    Entries < 0 are padding and never match, so left-padded rows behave like the row alone.
    """
    B, t = history.shape
    banned = torch.zeros(B, V + 1, dtype=torch.bool, device=history.device)
    if t < n or n < 1:
        return banned[:, :V]
    windows = history.unfold(1, n, 1)  # (B, t-n+1, n)
    real = (windows >= 0).all(-1)
    prefix = history[:, t - (n - 1) :] if n > 1 else history[:, :0]
    match = (windows[:, :, : n - 1] == prefix[:, None, :]).all(-1) & real & (prefix >= 0).all(-1, keepdim=True)
    nxt = torch.where(match, windows[:, :, n - 1], torch.full_like(windows[:, :, n - 1], V))
    banned.scatter_(1, nxt, True)
    return banned[:, :V]


def adjust_logits(
    logits: torch.Tensor, history: torch.Tensor | None, cfg: SamplerConfig, prompt_len: int = 0
) -> torch.Tensor:
    """Bans and penalties (the order-independent first stage); returns a new tensor.

    Repetition penalty and no-repeat-n-gram see the whole ``history`` (HF); presence/frequency
    penalties count only ``history[:, prompt_len:]`` — the generated tokens, as vLLM does.
    """
    B, V = logits.shape
    out = logits.float()
    if cfg.uses_history and history is not None and history.numel():
        history = history.to(torch.long)
        if history.dim() == 1:
            history = history[None, :].expand(B, -1)
        if history.shape[0] != B:
            raise ValueError(f"history has {history.shape[0]} rows but logits have {B}")
        if int(history.max()) >= V:
            raise ValueError(f"history holds token id {int(history.max())} outside the vocabulary of {V}")
        counts = _history_counts(history, V)
        if cfg.repetition_penalty != 1.0:
            out = apply_repetition_penalty(out, counts, cfg.repetition_penalty)
        if cfg.presence_penalty or cfg.frequency_penalty:
            out_counts = counts if prompt_len <= 0 else _history_counts(history[:, prompt_len:], V)
            out = apply_presence_frequency(out, out_counts, cfg.presence_penalty, cfg.frequency_penalty)
        if cfg.no_repeat_ngram:
            out = out.masked_fill(no_repeat_ngram_mask(history, cfg.no_repeat_ngram, V), NEG_INF)
    if cfg.ban_ids:
        bad = [i for i in cfg.ban_ids if i >= V]
        if bad:
            raise ValueError(f"ban_ids {bad} outside the vocabulary of {V} tokens")
        if len(set(cfg.ban_ids)) >= V:
            raise ValueError(f"ban_ids ban all {V} tokens: nothing left to generate")
        out = out.clone() if out is logits else out
        out[:, list(cfg.ban_ids)] = NEG_INF
    if out is logits:
        out = out.clone()
    return out


# ---- truncations --------------------------------------------------------------------------
def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the ``k`` largest logits per row (ties at the k-th value are all kept)."""
    V = logits.shape[-1]
    if not k or k >= V:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, NEG_INF)


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest prefix (by descending probability) whose mass reaches ``p`` — the crossing token included."""
    if p is None or p >= 1.0:
        return logits
    srt, idx = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(srt, dim=-1)
    before = probs.cumsum(-1) - probs  # mass strictly before each token
    remove_sorted = before >= p
    remove_sorted[..., 0] = False  # the top token is always kept
    remove = torch.zeros_like(remove_sorted).scatter_(-1, idx, remove_sorted)
    return logits.masked_fill(remove, NEG_INF)


def min_p_filter(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Keep tokens whose probability is at least ``min_p`` × the top probability."""
    if not min_p:
        return logits
    probs = torch.softmax(logits, dim=-1)
    thresh = probs.max(dim=-1, keepdim=True).values * min_p
    return logits.masked_fill(probs < thresh, NEG_INF)


def _run_stages(z: torch.Tensor, cfg: SamplerConfig) -> torch.Tensor:
    for stage in ORDERS[cfg.order]:
        if stage == "temp":
            if cfg.temperature != 1.0:
                z = z / cfg.temperature
        elif stage == "top_k":
            z = top_k_filter(z, cfg.top_k or 0)
        elif stage == "top_p":
            z = top_p_filter(z, cfg.top_p if cfg.top_p is not None else 1.0)
        elif stage == "min_p":
            z = min_p_filter(z, cfg.min_p or 0.0)
    return z


def process_logits(
    logits: torch.Tensor, history: torch.Tensor | None, cfg: SamplerConfig, prompt_len: int = 0
) -> torch.Tensor:
    """Final logits (B, V) whose softmax is the sampling distribution; removed tokens are ``-inf``.

    ``history`` (B, t) holds the tokens penalties count (prompt + generated); entries < 0 are
    padding; the first ``prompt_len`` columns are the prompt (not counted by presence/frequency
    penalties). In greedy mode only bans/penalties apply (truncation and τ never change an argmax).
    """
    if logits.dim() == 1:
        logits = logits[None, :]
    if logits.dim() != 2:
        raise ValueError(f"logits must be (batch, vocab), got shape {tuple(logits.shape)}")
    z = adjust_logits(logits, history, cfg, prompt_len)
    if not cfg.greedy:
        z = _run_stages(z, cfg)
    if cfg.no_repeat_ngram and not torch.isfinite(z).any(-1).all():
        raise ValueError("every token is banned at this step (no_repeat_ngram / ban_ids left nothing)")
    return z


def sampling_probs(
    logits: torch.Tensor, history: torch.Tensor | None, cfg: SamplerConfig, prompt_len: int = 0
) -> torch.Tensor:
    """The sampling distribution (B, V) — exact zeros for removed tokens."""
    return torch.softmax(process_logits(logits, history, cfg, prompt_len), dim=-1)


def sample_next(
    logits: torch.Tensor,
    history: torch.Tensor | None,
    cfg: SamplerConfig,
    generator: torch.Generator | None = None,
    processed: torch.Tensor | None = None,
) -> torch.Tensor:
    """Next token ids (B,): argmax of the processed logits if greedy, else one draw with ``generator``.

    ``processed`` lets a caller pass logits it already ran through :func:`process_logits`.
    """
    if logits.dim() == 1:
        logits = logits[None, :]
    if cfg.greedy and cfg.is_identity:
        return logits.argmax(dim=-1)
    z = process_logits(logits, history, cfg) if processed is None else processed
    if cfg.greedy:
        return z.argmax(dim=-1)
    probs = torch.softmax(z, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


def kept_set_size(logits: torch.Tensor, cfg: SamplerConfig, history: torch.Tensor | None = None) -> int:
    """How many tokens keep a non-zero probability for one row of ``logits`` (V,) under ``cfg``."""
    if logits.dim() != 1:
        raise ValueError(f"kept_set_size takes one row of logits (V,), got shape {tuple(logits.shape)}")
    z = process_logits(logits[None, :], None if history is None else history.reshape(1, -1), cfg)
    if cfg.greedy:
        return 1
    return int(torch.isfinite(z).sum())


def kept_set_sizes(logits: torch.Tensor, temperatures: Sequence[float], top_p: float, orders: Sequence[str] = ("trunc_then_temp", "temp_then_trunc")) -> list[dict]:
    """The order-trap table (seed §3.5.5): kept-set size per temperature under each order."""
    rows = []
    for t in temperatures:
        row = {"temperature": float(t)}
        for o in orders:
            row[o] = kept_set_size(logits, SamplerConfig(temperature=t, top_p=top_p, order=o))
        rows.append(row)
    return rows
