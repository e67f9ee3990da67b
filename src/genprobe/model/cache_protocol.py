"""The KV-cache contract :meth:`genprobe.model.GPT.forward` codes against.

It lives with the model, not with the caches (:mod:`genprobe.engine.cache`, :mod:`genprobe.engine.fast.static_cache`):
the forward is what needs it, and the engine, which implements it, sits above the model.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class CacheLike(Protocol):
    """What :meth:`genprobe.model.GPT.forward` needs from a KV cache (the engine's ``KVCache`` and ``StaticKVCache``).

    One forward makes exactly these calls: ``default_positions`` (only when the caller gave no
    positions), ``reserve`` once, ``write`` once per layer, ``commit`` once; and reads
    ``decode_mask_free`` to decide whether a plain decode step may skip its attention mask.
    """

    @property
    def decode_mask_free(self) -> bool:
        """True when a one-token step at the default position sees every cached key (its mask is all-True)."""
        ...

    def default_positions(self, T: int, valid: torch.Tensor | None = None) -> torch.Tensor:
        """Positions (B, T) of ``T`` new tokens continuing each row's count of real tokens."""
        ...

    def reserve(
        self, positions: torch.Tensor, valid: torch.Tensor | None, explicit_positions: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Claim slots for the new tokens; return (positions, validity) of every key attention reads."""
        ...

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``layer``'s new keys/values; return the keys/values attention reads."""
        ...

    def commit(self) -> None:
        """Advance the write pointer once every layer has written."""
        ...
