"""A fixed-shape KV cache for compiled decoding (gpt-fast's static cache, on our position-driven mask).

:class:`KVCache` hands attention only the live slots (``[:length]``), so every decode step has a new
key length; eager PyTorch does not care, but ``torch.compile`` would see a new shape every step.
:class:`StaticKVCache` keeps every tensor at full capacity and holds its write pointer in a tensor:
each step writes its keys with ``index_put_`` and attends over *all* slots, the unwritten ones being
invalid and therefore masked (the model decides visibility from per-slot positions and validity, as
it does for every cache). A decode step is then the same graph at every position — compiled once,
replayed for the whole generation — and no Python number changes between steps, so nothing forces
a recompile. Same protocol as :class:`KVCache` (:class:`~genprobe.model.cache_protocol.CacheLike`), so
it runs through the model's one forward, eager or compiled. No sliding window: a ring buffer needs a
data-dependent slot, which is what this cache exists to avoid.
"""

from __future__ import annotations

from typing import Any

import torch

from ...model.config import GPTConfig
from ..cache import check_batch, padded_positions


class StaticKVCache:
    """Per-layer K/V buffers of fixed capacity with a tensor write pointer (compile-friendly)."""

    def __init__(
        self,
        n_layer: int,
        batch_size: int,
        n_head: int,
        d_head: int,
        max_len: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ):
        if batch_size < 1 or max_len < 1:
            raise ValueError(f"batch_size and max_len must be >= 1, got {batch_size}, {max_len}")
        self.capacity = max_len
        self.n_layer = n_layer
        # One base tensor per layer (not one 5-D tensor): a write into a *view* of a larger buffer is
        # functionalised by torch.compile into a copy of the whole buffer every step; into a base tensor
        # it is re-inplaced into a scatter of the new rows.
        shape = (batch_size, n_head, max_len, d_head)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layer)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layer)]
        self.pos = torch.zeros(batch_size, max_len, dtype=torch.long, device=device)
        self.valid = torch.zeros(batch_size, max_len, dtype=torch.bool, device=device)
        self.next_pos = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.write_ptr = torch.zeros(1, dtype=torch.long, device=device)  # slots written so far
        self._slot_offsets = torch.arange(max_len, device=device)
        self._step: tuple[torch.Tensor, torch.Tensor | None, int | None] | None = None
        self._filled: int | None = None

    @classmethod
    def for_model(cls, cfg: GPTConfig, batch_size: int = 1, max_len: int | None = None, **kw: Any) -> "StaticKVCache":
        """A cache shaped for ``cfg`` (capacity defaults to the model's context length)."""
        return cls(cfg.n_layer, batch_size, cfg.n_kv_head, cfg.d_head, max_len or cfg.block_size, **kw)

    def view(self, filled: int | None = None) -> "StaticKVCache":
        """The same cache (every buffer shared) with per-forward bookkeeping of its own.

        A compiled decode loop (``torch.while_loop``) may mutate tensors from outside its body but not
        Python attributes of outside objects; one forward through a view created inside the body keeps
        ``reserve``/``write``/``commit``'s hand-over (``_step``) inside the body.

        ``filled``: the slots written once this forward's tokens are (the caller knows it on the host; a symbol
        when compiled). Compiled attention then reads those slots only instead of every slot of the capacity:
        one graph still serves every step when the caller marks it dynamic (see
        :func:`genprobe.engine.fast.compiled._decode_step`).
        """
        v = object.__new__(StaticKVCache)
        v.capacity, v.n_layer = self.capacity, self.n_layer
        v.k, v.v, v.pos, v.valid = self.k, self.v, self.pos, self.valid
        v.next_pos, v.write_ptr, v._slot_offsets = self.next_pos, self.write_ptr, self._slot_offsets
        v._step, v._filled = None, filled
        return v

    def tensors(self) -> list[torch.Tensor]:
        """Every buffer, in the order :meth:`from_tensors` takes them (the inputs of an exported program)."""
        kv = [t for layer in range(self.n_layer) for t in (self.k[layer], self.v[layer])]
        return [self.pos, self.valid, self.next_pos, self.write_ptr, self._slot_offsets, *kv]

    @classmethod
    def from_tensors(cls, tensors: list[torch.Tensor] | tuple[torch.Tensor, ...]) -> "StaticKVCache":
        """A cache over the buffers of :meth:`tensors` (shared, not copied): how exported programs receive one."""
        c = object.__new__(cls)
        c.pos, c.valid, c.next_pos, c.write_ptr, c._slot_offsets, *kv = tensors
        c.k, c.v = list(kv[0::2]), list(kv[1::2])
        c.capacity, c.n_layer = c.pos.shape[1], len(c.k)
        c._step, c._filled = None, None
        return c

    @property
    def batch_size(self) -> int:
        """Rows of the cache, read from a buffer's shape: a symbol, not a Python int, when compiled for any batch."""
        return int(self.next_pos.shape[0])

    @property
    def length(self) -> int:
        """Number of slots written (a host read of the pointer: call it outside compiled code)."""
        return int(self.write_ptr)

    def reset(self) -> None:
        """Forget everything (buffers are reused, not reallocated)."""
        self.write_ptr.zero_()
        self.next_pos.zero_()
        self.valid.zero_()
        self._step = None

    @property
    def decode_mask_free(self) -> bool:
        """Always False: attention reads every slot, and the unwritten ones must be masked."""
        return False

    def default_positions(self, T: int, valid: torch.Tensor | None = None) -> torch.Tensor:
        """Per-row positions for ``T`` new tokens: continue each row's count of real tokens."""
        if valid is None:
            return self.next_pos[:, None] + self._slot_offsets[:T]
        return padded_positions(self.next_pos, valid)

    # ---- the three calls the model makes during one forward ------------------------------------
    def reserve(
        self, positions: torch.Tensor, valid: torch.Tensor | None, explicit_positions: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Record positions/validity of T new tokens at the write pointer; return all slots' (pos, valid).

        ``explicit_positions`` changes nothing here: the mask is always built from the slots' positions.
        """
        if torch.compiler.is_compiling():
            # A compiled step may take the batch size as a symbol (see genprobe.engine.fast.compiled): comparing it
            # with the Python int here would specialise it. The compiled runner built this cache for its batch.
            B, T = positions.shape
        else:
            B, T = check_batch(positions, self.batch_size)
        live = self._filled
        if not torch.compiler.is_compiling():
            # Eager calls (prefill) read the pointer on the host: to check capacity, and to attend over the
            # written slots only, exactly as KVCache does (so prefill is bit-identical to no cache). Compiled
            # decoders check capacity before the call, and attend over every slot (one shape for all steps) or
            # over the slots a view was told are filled (a symbol of the graph).
            seen = int(self.write_ptr)
            if seen + T > self.capacity:
                raise ValueError(f"KV cache overflow: {seen} cached + {T} new tokens > capacity {self.capacity}")
            live = seen + T
        slots = self.write_ptr + self._slot_offsets[:T]
        self.pos[:, slots] = positions
        self.valid[:, slots] = True if valid is None else valid
        self._step = (slots, valid, live)
        if live is None:
            return self.pos, self.valid
        return self.pos[:, :live], self.valid[:, :live]

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this step's K/V of ``layer`` at the reserved slots; return the full buffers."""
        assert self._step is not None, "reserve() must precede write()"
        slots, _, live = self._step
        # Advanced-index assignment (index_put_) into the layer's base tensor, as gpt-fast does.
        k_buf, v_buf = self.k[layer], self.v[layer]
        k_buf[:, :, slots] = k
        v_buf[:, :, slots] = v
        if live is None:
            return k_buf, v_buf
        return k_buf[:, :, :live], v_buf[:, :, :live]

    def commit(self) -> None:
        """Advance the write pointer and the per-row position counters after all layers have written."""
        assert self._step is not None, "reserve() must precede commit()"
        slots, valid, _ = self._step
        T = slots.shape[0]
        self.write_ptr.add_(T)
        if valid is None:
            self.next_pos.add_(T)
        else:
            self.next_pos.add_(valid.to(torch.long).sum(1))
        self._step = None
