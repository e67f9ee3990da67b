"""The one configuration dataclass of the reference GPT (defaults = the chapter's table)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

POS_ENCODINGS = ("learned", "rope", "alibi", "none")


@dataclass(frozen=True)
class GPTConfig:
    """Hyper-parameters of the reference model; defaults reproduce chapter §3.1.6 (≈426k parameters).

    ``vocab_size`` = 1,200 characters + ``<pad>`` + ``<unk>``.
    """

    vocab_size: int = 1202
    n_layer: int = 2
    n_head: int = 4
    d_model: int = 128
    d_ff: int = 256
    block_size: int = 64
    pos_encoding: str = "learned"
    dropout: float = 0.0
    layer_norm_eps: float = 1e-5
    rope_base: float = 10000.0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_layer", "n_head", "d_model", "d_ff", "block_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"GPTConfig.{name} must be a positive integer, got {v!r}")
        if self.d_model % self.n_head:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_head ({self.n_head})")
        if self.pos_encoding not in POS_ENCODINGS:
            raise ValueError(f"pos_encoding must be one of {POS_ENCODINGS}, got {self.pos_encoding!r}")
        if self.pos_encoding == "rope" and (self.d_model // self.n_head) % 2:
            raise ValueError("rope needs an even head dimension")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_head

    @property
    def n_kv_head(self) -> int:
        """Key/value heads (a cache's rows per layer): every head has its own, GPT-2 style (no grouped queries)."""
        return self.n_head

    @property
    def max_positions(self) -> int | None:
        """Longest sequence the model accepts: ``block_size`` for a learned position table, else None (unbounded)."""
        return self.block_size if self.pos_encoding == "learned" else None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "GPTConfig":
        """Build from a dict, refusing unknown keys (a config for another model family)."""
        if unknown := set(d) - {f.name for f in fields(cls)}:
            raise ValueError(f"unknown GPTConfig keys: {sorted(unknown)}")
        return cls(**d)
