"""The reference GPT: GPT-2 layout (pre-LN, GELU, tied embeddings) with one position-driven forward.

Every phase — training, prefill, single-token decode, chunked prefill, multi-token verification —
goes through :meth:`GPT.forward`. Visibility is decided from *absolute positions* (a key is visible
to a query iff ``pos_k <= pos_q``, it is not padding, and, when packing, it belongs to the same
document), never from tensor indices. That is what makes a cache, left padding, a sliding window
and packing one code path instead of four (seed §3.9, §3.10).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .cache_protocol import CacheLike
from .config import GPTConfig
from .position_lm import PositionDrivenLM, rotate


def alibi_slopes(n_head: int) -> torch.Tensor:
    """Per-head ALiBi slopes (Press et al. 2022), geometric from 2^(-8/n)."""

    def _pow2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * (start**i) for i in range(n)]

    if math.log2(n_head).is_integer():
        s = _pow2(n_head)
    else:
        closest = 2 ** math.floor(math.log2(n_head))
        s = _pow2(closest) + _pow2(2 * closest)[0::2][: n_head - closest]
    return torch.tensor(s, dtype=torch.float32)


def rope_rotate(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """Rotate (B, H, T, Dh) by absolute ``positions`` (B, T) — rotate-half (NeoX/Llama) convention."""
    d = x.shape[-1]
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = positions.to(torch.float32)[:, None, :, None] * inv_freq  # (B,1,T,d/2)
    ang = torch.cat([ang, ang], dim=-1)
    return rotate(x, ang.cos().to(x.dtype), ang.sin().to(x.dtype))


class CausalSelfAttention(nn.Module):
    """Multi-head attention with a fused QKV projection (GPT-2 ``c_attn``) and output ``c_proj``."""

    def __init__(self, cfg: GPTConfig, layer_idx: int):
        super().__init__()
        self.cfg = cfg
        self.layer_idx = layer_idx
        self.c_attn = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.c_proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.attn_dropout = cfg.dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor | None,
        cache: "CacheLike | None",
        attn_store: list[torch.Tensor] | None,
    ) -> torch.Tensor:
        """``mask``: (B,1,Tq,Tk) bool visibility or float additive bias (ALiBi), built once per forward."""
        B, T, C = x.shape
        H, Dh = self.cfg.n_head, self.cfg.d_head
        # One view + permute instead of split + 3 views + 3 transposes: fewer ops per decode step.
        q, k, v = self.c_attn(x).view(B, T, 3, H, Dh).permute(2, 0, 3, 1, 4).unbind(0)
        if self.cfg.pos_encoding == "rope":
            q = rope_rotate(q, positions, self.cfg.rope_base)
            k = rope_rotate(k, positions, self.cfg.rope_base)
        if cache is not None:
            # Keys/values of this step are written in place; attention reads the live region.
            k, v = cache.write(self.layer_idx, k, v)
        # Explicit softmax path when probabilities are requested, and for single-query decode steps: on
        # CPU the fused SDPA kernel is tuned for long query blocks and is several times slower than two
        # small matmuls at Tq=1 (same maths; decode is compared to recomputation with a tolerance anyway).
        if attn_store is not None or (T == 1 and not self.training):
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(Dh))
            if mask is None:
                pass
            elif mask.dtype == torch.bool:
                scores = scores.masked_fill(~mask, float("-inf"))
            else:
                scores = scores + mask
            probs = torch.softmax(scores, dim=-1)
            if attn_store is not None:
                attn_store.append(probs.detach())
            y = probs @ v
        else:
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=self.attn_dropout if self.training else 0.0
            )
        out: torch.Tensor = self.c_proj(y.transpose(1, 2).reshape(B, T, C))
        # Dropout modules are skipped outright in eval: each call costs microseconds per decode step.
        if self.training:
            out = self.resid_dropout(out)
        return out


class MLP(nn.Module):
    """GPT-2 feed-forward: ``c_fc`` → GELU (tanh form, as GPT-2's gelu_new) → ``c_proj``."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.d_model, cfg.d_ff)
        self.c_proj = nn.Linear(cfg.d_ff, cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))
        if self.training:
            y = self.dropout(y)
        return y


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, cfg: GPTConfig, layer_idx: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.attn = CausalSelfAttention(cfg, layer_idx)
        self.ln_2 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.mlp = MLP(cfg)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor | None,
        cache: "CacheLike | None",
        attn_store: list[torch.Tensor] | None,
    ) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), positions, mask, cache, attn_store)
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(PositionDrivenLM):
    """Character-level GPT, GPT-2 compatible when ``pos_encoding == 'learned'``."""

    cfg: GPTConfig

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.block_size, cfg.d_model) if cfg.pos_encoding == "learned" else None
        self.drop = nn.Dropout(cfg.dropout)
        self.h = nn.ModuleList([Block(cfg, i) for i in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as GPT-2
        if cfg.pos_encoding == "alibi":
            self.register_buffer("alibi_slopes", alibi_slopes(cfg.n_head), persistent=False)
        else:
            self.alibi_slopes = None
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # GPT-2's scaled init of residual projections
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        cache: "CacheLike | None" = None,
        attention_mask: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
        attn_store: list[torch.Tensor] | None = None,
        hidden_store: list[torch.Tensor] | None = None,
        logits_to_keep: int = 0,
    ) -> torch.Tensor:
        """Logits (B, T, V) for ``ids`` (B, T) at absolute ``positions`` (B, T).

        ``attention_mask`` (B, T) marks real (1) vs padding (0) tokens of *this call*; earlier keys'
        validity lives in the cache. ``document_ids`` (B, T) gives packed rows a block-diagonal
        causal mask. ``attn_store`` receives per-layer attention probabilities (B, H, Tq, Tk);
        ``hidden_store`` the residual stream after every block. ``logits_to_keep`` > 0 returns the logits
        of the last that many positions only (B, logits_to_keep, V), as ``transformers``' argument of that
        name: a prompt's forward needs only its last position, and the head is the largest product of a
        small-vocabulary model. Use :func:`genprobe.engine.runner.forward_step` for cache-aware default positions.
        """
        positions, valid, defaulted = self._checked_inputs(ids, positions, cache, attention_mask, logits_to_keep)
        mask = self._attention_bias(ids, positions, valid, cache, document_ids, defaulted)
        x = self.wte(ids)
        if self.wpe is not None:
            x = x + self.wpe(positions)
        if self.training:
            x = self.drop(x)
        for block in self.h:
            x = block(x, positions, mask, cache, attn_store)
            if hidden_store is not None:
                hidden_store.append(x)
        if cache is not None:
            cache.commit()
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        logits: torch.Tensor = self.lm_head(self.ln_f(x))
        return logits

    def _attention_bias(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        valid: torch.Tensor | None,
        cache: "CacheLike | None",
        document_ids: torch.Tensor | None,
        defaulted: bool,
    ) -> torch.Tensor | None:
        """The (B, 1, Tq, Tk) mask (bool; or additive float with ALiBi) every layer shares, None when every key is
        visible. With a cache, this call's keys are reserved in it first."""
        if cache is not None and document_ids is not None:
            raise ValueError("document_ids (packing) is a training-time feature; not supported with a cache")
        k_pos, k_valid = self._keys(positions, valid, cache, defaulted)
        plain_decode = ids.shape[1] == 1 and valid is None and defaulted and self.alibi_slopes is None
        if cache is not None and plain_decode and cache.decode_mask_free:
            # Plain decode step: one real query at the newest position, every cached key real and at
            # an earlier default position — all keys are visible, the mask would be all-True: skip it.
            visible = None
        else:
            visible = self._visibility(positions, k_pos, k_valid, document_ids, queries_real=valid is None)
        mask = None if visible is None else visible[:, None, :, :]
        if self.alibi_slopes is not None:
            dist = (positions[:, None, :, None] - k_pos[:, None, None, :]).to(torch.float32)
            alibi = -self.alibi_slopes.view(1, -1, 1, 1) * dist.clamp(min=0)
            dtype = self.wte.weight.dtype
            blocked = torch.zeros(mask.shape, dtype=dtype, device=ids.device).masked_fill(~mask, float("-inf"))
            mask = blocked + alibi.to(dtype)
        return mask


def masked_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, loss_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Mean next-token cross-entropy over real positions only: Σ mask·CE / Σ mask (seed Eq. 3.4)."""
    ce = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), reduction="none")
    if loss_mask is None:
        return ce.mean()
    m = loss_mask.reshape(-1).to(ce.dtype)
    denom = m.sum()
    if float(denom) == 0:
        raise ValueError("loss_mask selects no position: the loss is undefined")
    return (ce * m).sum() / denom


def packed_positions(document_ids: torch.Tensor) -> torch.Tensor:
    """Positions restarting at 0 at every document boundary of a packed row (B, T)."""
    B, T = document_ids.shape
    idx = torch.arange(T, device=document_ids.device).expand(B, T)
    start = torch.ones_like(document_ids, dtype=torch.bool)
    start[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
    first = torch.where(start, idx, torch.zeros_like(idx)).cummax(dim=1).values
    return idx - first
