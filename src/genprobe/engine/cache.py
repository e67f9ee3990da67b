"""Preallocated KV cache with an O(1) write pointer, optional sliding window and attention sinks.

Each layer owns a (B, heads, capacity, d_head) buffer for K and for V, written in place — no
``torch.cat`` per step (seed §3.10.7: the copy eats the savings). Beside the tensors the cache keeps,
per slot, the absolute position and whether the slot holds a real token; the model builds its mask
from those, so the order of slots never matters (attention is invariant to a joint permutation of
keys and values, seed Eq. 3.26–3.29). That is what lets the sliding window be a ring buffer.
"""

from __future__ import annotations

from typing import Any

import torch

from ..model.config import GPTConfig


def padded_positions(next_pos: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Positions of new tokens (B, T) continuing per-row counters ``next_pos``; padding does not advance them."""
    if valid.shape[1] == 1:  # a decode step: the row's count, real or padding (the cumsum below gives the same)
        return next_pos[:, None].clone()
    steps = valid.to(torch.long).cumsum(1) - 1
    return next_pos[:, None] + steps.clamp(min=0)


def check_batch(positions: torch.Tensor, batch_size: int) -> tuple[int, int]:
    """(B, T) of ``positions``, refusing a batch size other than the cache's."""
    B, T = positions.shape
    if B != batch_size:
        raise ValueError(f"batch size {B} does not match the cache's {batch_size}")
    return B, T


class KVCache:
    """Per-layer K/V buffers plus slot positions/validity; ``length`` = entries currently held."""

    def __init__(
        self,
        n_layer: int,
        batch_size: int,
        n_head: int,
        d_head: int,
        max_len: int,
        window: int | None = None,
        sinks: int = 0,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ):
        if batch_size < 1 or max_len < 1:
            raise ValueError(f"batch_size and max_len must be >= 1, got {batch_size}, {max_len}")
        if window is not None and window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if sinks < 0 or (sinks and window is None):
            raise ValueError("sinks (>= 0) only make sense together with a sliding window")
        self.window = window
        self.sinks = sinks
        self.capacity = max_len if window is None else min(max_len, sinks + window)
        shape = (n_layer, batch_size, n_head, self.capacity, d_head)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.pos = torch.zeros(batch_size, self.capacity, dtype=torch.long, device=device)
        self.valid = torch.zeros(batch_size, self.capacity, dtype=torch.bool, device=device)
        self.batch_size = batch_size
        self.n_layer = n_layer
        self.seen = 0  # tokens ever written (per row, padding included)
        self.next_pos = torch.zeros(batch_size, dtype=torch.long, device=device)
        # True while every slot ever written held a real token ...
        self.all_valid = True
        # ... and every write used default positions: then a plain decode step may skip its mask.
        self.default_positions_only = True
        self._slots: torch.Tensor | slice | None = None
        self._live = 0

    @classmethod
    def for_model(cls, cfg: GPTConfig, batch_size: int = 1, max_len: int | None = None, **kw: Any) -> "KVCache":
        """A cache shaped for ``cfg`` (capacity defaults to the model's context length)."""
        return cls(cfg.n_layer, batch_size, cfg.n_kv_head, cfg.d_head, max_len or cfg.block_size, **kw)

    @property
    def length(self) -> int:
        """Number of slots currently holding keys/values."""
        return min(self.seen, self.capacity)

    def reset(self) -> None:
        """Forget everything (buffers are reused, not reallocated)."""
        self.seen = 0
        self.next_pos.zero_()
        self.valid.zero_()
        self.all_valid = True
        self.default_positions_only = True
        self._slots = None

    def truncate(self, keep: int) -> None:
        """Keep the first ``keep`` tokens, forget the rest (speculative decoding's rollback after a rejection).

        Only an unpadded batch whose slots are still in write order (no ring wrap) can be cut: the dropped slots
        are marked invalid and the write pointer and position counters move back to ``keep``."""
        if self.window is not None and self.seen > self.capacity:
            raise ValueError("a sliding-window cache that wrapped around cannot be rolled back")
        if not 0 <= keep <= self.seen:
            raise ValueError(f"cannot keep {keep} tokens of a cache holding {self.seen}")
        if not self.all_valid:
            raise ValueError("a cache holding padding cannot be rolled back by token count")
        self.valid[:, keep : self.seen] = False
        self.next_pos = self.next_pos - (self.seen - keep)
        self.seen = keep

    @property
    def decode_mask_free(self) -> bool:
        """True while every key is real and at an earlier default position: a decode step sees them all."""
        return self.all_valid and self.default_positions_only

    def default_positions(self, T: int, valid: torch.Tensor | None = None) -> torch.Tensor:
        """Per-row positions for ``T`` new tokens: continue each row's count of real tokens."""
        if valid is None:
            if T == 1:  # a decode step: the positions are the per-row counters themselves (a view, no op)
                return self.next_pos[:, None]
            return self.next_pos[:, None] + torch.arange(T, device=self.next_pos.device)
        return padded_positions(self.next_pos, valid)

    # ---- the three calls the model makes during one forward ------------------------------------
    def reserve(
        self, positions: torch.Tensor, valid: torch.Tensor | None, explicit_positions: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Claim slots for T new tokens, record their positions/validity; return live (pos, valid)."""
        B, T = check_batch(positions, self.batch_size)
        if explicit_positions:  # the caller's positions: later keys may not all be earlier than a query
            self.default_positions_only = False
        if valid is not None and self.all_valid:
            self.all_valid = bool(valid.all())
        end = self.seen + T
        if end <= self.capacity:
            slots: torch.Tensor | slice = slice(self.seen, end)
            live = end
        elif self.window is None:
            raise ValueError(f"KV cache overflow: {self.seen} cached + {T} new tokens > capacity {self.capacity}")
        else:
            if T != 1 and self.seen + T > self.capacity:
                raise ValueError(
                    f"a sliding-window cache that is full accepts one token per step; got {T} "
                    f"(window {self.window}, sinks {self.sinks})"
                )
            ring = self.capacity - self.sinks
            slot = self.sinks + (self.seen - self.sinks) % ring
            slots = slice(slot, slot + 1)
            live = self.capacity
        self.pos[:, slots] = positions
        if valid is None:
            self.valid[:, slots] = True
        else:
            self.valid[:, slots] = valid
        self._slots, self._live, self._T = slots, live, T
        self._new_valid = valid
        return self.pos[:, :live], self.valid[:, :live]

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this step's K/V of ``layer`` in place; return views of the live keys/values."""
        self.k[layer, :, :, self._slots] = k
        self.v[layer, :, :, self._slots] = v
        return self.k[layer, :, :, : self._live], self.v[layer, :, :, : self._live]

    def commit(self) -> None:
        """Advance the write pointer after all layers have written."""
        self.seen += self._T
        if self._new_valid is None:
            self.next_pos = self.next_pos + self._T
        else:
            self.next_pos = self.next_pos + self._new_valid.to(torch.long).sum(1)
        self._slots = None
