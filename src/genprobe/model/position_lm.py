"""What every genprobe forward shares: one position-driven visibility rule and the checks before it.

A key is visible to a query iff ``pos_k <= pos_q``, it is not padding, and (packing) it belongs to the same
document; a sliding window adds ``pos_q - pos_k < window``. :class:`~genprobe.model.gpt.GPT` and
:class:`~genprobe.model.llama_family.LlamaFamily` both derive from :class:`PositionDrivenLM`, so a cache, left
padding, a window and packing are one code path for either, and the engine's runners (eager and compiled) drive
both through the same ``forward(ids, positions, cache, attention_mask, logits_to_keep=...)``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from .cache_protocol import CacheLike


class PositionDrivenLM(nn.Module):
    """A causal LM whose forward decides visibility from absolute positions; ``cfg`` gives its vocabulary and limits."""

    cfg: Any
    wte: nn.Embedding  # the token embedding (the fast path reads its dtype)

    def num_parameters(self) -> int:
        """Number of distinct parameters (a tied embedding counted once)."""
        return sum(p.numel() for p in self.parameters())

    def check_positions(self, positions: torch.Tensor) -> None:
        """Raise ValueError naming the context length if any position is outside the position table."""
        if positions.numel() == 0:
            return
        lo, hi = (int(t) for t in torch.aminmax(positions))
        if lo < 0:
            raise ValueError(f"negative position {lo}: positions must be >= 0")
        if self.cfg.pos_encoding == "learned" and hi >= self.cfg.block_size:
            raise ValueError(
                f"context overflow: position {hi} needs a sequence of {hi + 1} tokens but the model's "
                f"context length (block_size, rows of the learned position table) is {self.cfg.block_size}"
            )

    def check_ids(self, ids: torch.Tensor) -> None:
        """Raise ValueError naming the vocabulary size if any token id is outside the embedding table."""
        id_lo, id_hi = (int(t) for t in torch.aminmax(ids))
        if id_lo < 0 or id_hi >= self.cfg.vocab_size:
            raise ValueError(f"token id out of range [0, {self.cfg.vocab_size}): min {id_lo}, max {id_hi}")

    def _visibility(
        self,
        q_pos: torch.Tensor,
        k_pos: torch.Tensor,
        k_valid: torch.Tensor | None,
        doc: torch.Tensor | None = None,
        queries_real: bool = False,
        window: int | None = None,
    ) -> torch.Tensor:
        """(B,Tq,Tk) bool: key visible to query iff pos_k <= pos_q, key is real, same document, and (with a sliding
        ``window``) pos_q - pos_k < window, as ``transformers``' sliding-window mask has it."""
        vis = k_pos[:, None, :] <= q_pos[:, :, None]
        if window is not None:
            vis = vis & (q_pos[:, :, None] - k_pos[:, None, :] < window)
        if k_valid is not None:
            vis = vis & k_valid[:, None, :]
        if doc is not None:  # packing (no cache): queries and keys are the same tokens
            vis = vis & (doc[:, None, :] == doc[:, :, None])
        if queries_real:
            return vis  # every real query sees at least its own key (pos_k == pos_q): no empty row
        # A query with no visible key (a padding query) would give NaN; let it see everything.
        # Its output is never used: padded positions are excluded from logits comparisons and loss.
        empty = ~vis.any(dim=-1, keepdim=True)
        return vis | empty

    def _keys(
        self, positions: torch.Tensor, valid: torch.Tensor | None, cache: CacheLike | None, defaulted: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(positions, validity) of the keys attention reads: this call's, or with a cache every cached key (this
        call's reserved in it first)."""
        if cache is None:
            return positions, valid
        return cache.reserve(positions, valid, explicit_positions=not defaulted)

    def _checked_inputs(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor | None,
        cache: "CacheLike | None",
        attention_mask: torch.Tensor | None,
        logits_to_keep: int,
    ) -> tuple[torch.Tensor, torch.Tensor | None, bool]:
        """(positions, key validity of this call or None, whether the positions were defaulted), every shape and
        range checked before any embedding lookup."""
        if ids.dim() != 2:
            raise ValueError(f"ids must be (batch, time), got shape {tuple(ids.shape)}")
        B, T = ids.shape
        if T == 0:
            raise ValueError("ids has no tokens")
        if logits_to_keep < 0:
            raise ValueError(f"logits_to_keep must be >= 0 (0 keeps every position), got {logits_to_keep}")
        defaulted = positions is None
        if positions is None:
            positions = default_positions(B, T, cache, attention_mask, ids.device)
        if positions.shape != (B, T):
            raise ValueError(f"positions shape {tuple(positions.shape)} != ids shape {(B, T)}")
        if not torch.compiler.is_compiling():
            # Range checks read tensor values on the host, which would split a compiled graph; a compiled
            # caller (genprobe.engine.fast.compiled) checks the same limits before it calls.
            self.check_positions(positions)
            self.check_ids(ids)
        valid = None if attention_mask is None else attention_mask.to(torch.bool)
        if valid is not None and valid.shape != (B, T):
            raise ValueError(f"attention_mask shape {tuple(valid.shape)} != ids shape {(B, T)}")
        return positions, valid, defaulted


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary positions on the first ``cos.shape[-1]`` dims of ``x`` (B, heads, T, Dh), rotate-half convention."""
    r, d = cos.shape[-1], x.shape[-1]
    if r < d:  # partial rotary: the last d - r dims pass unrotated
        return torch.cat([rotate(x[..., :r], cos, sin), x[..., r:]], dim=-1)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def default_positions(
    B: int, T: int, cache: "CacheLike | None", attention_mask: torch.Tensor | None, device: torch.device
) -> torch.Tensor:
    """Positions when none are given: continue the cache's per-row count; padding does not advance it."""
    if cache is not None:
        return cache.default_positions(T, None if attention_mask is None else attention_mask.to(torch.bool))
    if attention_mask is not None:
        return (attention_mask.to(torch.long).cumsum(1) - 1).clamp(min=0)
    return torch.arange(T, device=device).expand(B, T)
