"""Adjustments that read the token history: bans, repetition/presence/frequency penalties, no-repeat-n-gram.

Each engine's *scope* and *arithmetic* (history entries < 0 are left padding and never count):

=============  =========================================  =====================================
engine         repetition penalty                         presence / frequency penalties
=============  =========================================  =====================================
``genprobe``   prompt + output (or the last ``n``); HF's  output tokens only (OpenAI/vLLM); a
               ``x/p`` / ``x·p`` arithmetic               window keeps only the last ``n``
``hf``         prompt + output: ``where(x<0, x·p, x/p)``  not in transformers: OpenAI definition
               (RepetitionPenaltyLogitsProcessor)         (output tokens only)
``vllm``       prompt ∪ output: ``x · where(x>0, 1/p,     output tokens only:
               p)`` (_custom_ops.apply_repetition_...)    ``x -= f·count + r·1[count>0]``
``llama.cpp``  the last ``penalty_last_n`` (64) tokens,   the same window, prompt included
               prompt included: ``x<=0 ? x·p : x/p``      (llama_sampler_penalties_apply)
=============  =========================================  =====================================
"""

from __future__ import annotations

import torch

from .config import LLAMA_CPP_PENALTY_LAST_N, SamplerConfig

NEG_INF = float("-inf")


def history_counts(history: torch.Tensor, V: int) -> torch.Tensor:
    """(B, V) float counts of each token in ``history``; entries < 0 (padding) are ignored."""
    B = history.shape[0]
    idx = torch.where(history >= 0, history, torch.full_like(history, V))
    counts = torch.zeros(B, V + 1, dtype=torch.float32, device=history.device)
    counts.scatter_add_(1, idx, torch.ones_like(idx, dtype=torch.float32))
    return counts[:, :V]


def last_real_tokens(history: torch.Tensor, n: int) -> torch.Tensor:
    """``history`` with everything but each row's last ``n`` real (>= 0) tokens turned into padding (-1)."""
    real = history >= 0
    from_end = real.flip(1).cumsum(1).flip(1)  # 1 for the newest real token, 2 for the one before, ...
    return torch.where(real & (from_end <= n), history, torch.full_like(history, -1))


def apply_repetition_penalty(logits: torch.Tensor, history: torch.Tensor, penalty: float, engine: str) -> torch.Tensor:
    """Penalise the ids in ``history`` once each, gathering only those columns (as HF does).

    HF/genprobe: ``where(x < 0, x·p, x/p)``; vLLM: ``x · where(x > 0, 1/p, p)`` with ``p`` in float32.
    """
    B, V = logits.shape
    idx = torch.where(history >= 0, history, torch.full_like(history, V))  # padding → a spare column
    ext = torch.cat([logits, logits.new_zeros(B, 1)], dim=1)
    x = ext.gather(1, idx)
    if engine == "vllm":
        p = torch.tensor(penalty, dtype=torch.float32, device=logits.device)
        x = x * torch.where(x > 0, 1.0 / p, p)
    else:
        x = torch.where(x < 0, x * penalty, x / penalty)
    return ext.scatter(1, idx, x)[:, :V]


def apply_presence_frequency(
    logits: torch.Tensor, counts: torch.Tensor, presence: float, frequency: float
) -> torch.Tensor:
    """OpenAI/vLLM: subtract ``frequency * count + presence * 1[count > 0]``."""
    logits = logits - frequency * counts.to(logits.dtype)
    return logits - presence * (counts > 0).to(logits.dtype)


def apply_llama_cpp_penalties(logits: torch.Tensor, counts: torch.Tensor, cfg: SamplerConfig) -> torch.Tensor:
    """llama.cpp: ``x <= 0 ? x·p : x/p`` then ``x -= count·f + 1[count>0]·r`` on tokens in the window."""
    seen = counts > 0
    rep = torch.where(logits <= 0, logits * cfg.repetition_penalty, logits / cfg.repetition_penalty)
    pen = rep - (counts * cfg.frequency_penalty + seen.to(logits.dtype) * cfg.presence_penalty)
    return torch.where(seen, pen, logits)


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


def penalty_window(cfg: SamplerConfig) -> int:
    """How many recent tokens the penalties count: -1 = all, 0 = none (llama.cpp's default is 64)."""
    if cfg.penalty_last_n is not None:
        return cfg.penalty_last_n
    return LLAMA_CPP_PENALTY_LAST_N if cfg.engine == "llama.cpp" else -1


def apply_penalties(logits: torch.Tensor, history: torch.Tensor, cfg: SamplerConfig, prompt_len: int) -> torch.Tensor:
    """Repetition, presence and frequency penalties with ``cfg.engine``'s scope and arithmetic."""
    V = logits.shape[1]
    n = penalty_window(cfg)
    if n == 0:
        return logits
    scoped = history if n < 0 else last_real_tokens(history, n)
    if cfg.engine == "llama.cpp":
        return apply_llama_cpp_penalties(logits, history_counts(scoped, V), cfg)
    if cfg.repetition_penalty != 1.0:
        assert cfg.engine is not None  # SamplerConfig.__post_init__ resolves it
        logits = apply_repetition_penalty(logits, scoped, cfg.repetition_penalty, cfg.engine)
    if cfg.presence_penalty or cfg.frequency_penalty:
        out_counts = history_counts(scoped[:, prompt_len:], V)
        logits = apply_presence_frequency(logits, out_counts, cfg.presence_penalty, cfg.frequency_penalty)
    return logits


def apply_bans(logits: torch.Tensor, ban_ids: tuple[int, ...]) -> torch.Tensor:
    """Set the banned ids to ``-inf``; ids outside the vocabulary or banning everything raise."""
    V = logits.shape[1]
    bad = [i for i in ban_ids if i >= V]
    if bad:
        raise ValueError(f"ban_ids {bad} outside the vocabulary of {V} tokens")
    if len(set(ban_ids)) >= V:
        raise ValueError(f"ban_ids ban all {V} tokens: nothing left to generate")
    out = logits.clone()
    out[:, list(ban_ids)] = NEG_INF
    return out
