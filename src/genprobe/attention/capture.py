"""Capture attention probabilities per layer and head, from our GPT or any ``transformers`` causal LM.

Our GPT records probabilities through the explicit-softmax path of its one forward (``attn_store``).
HF models only return weights with the ``eager`` implementation: with ``sdpa`` / ``flash_attention_*``
``output_attentions=True`` silently yields an empty tuple, so we switch to eager for the call (and back),
and say so in the result; a model that cannot switch raises :class:`AttentionUnavailableError`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..model.arch import unwrap
from ..model.gpt import GPT
from ..model.hf import set_attn_implementation


class AttentionUnavailableError(ValueError):
    """The model's attention implementation cannot return attention weights."""


# Every layer's (heads, T, T) float32 map is held at once (eager attention returns them all together).
MAX_CAPTURE_BYTES = 4 << 30


def capture_bytes(n_layer: int, n_head: int, seq_len: int) -> int:
    """Bytes of the captured maps: layers × heads × T² float32 values."""
    return n_layer * n_head * seq_len * seq_len * 4


@dataclass
class AttentionCapture:
    """Attention of one unpadded sequence, ``probs`` (L, H, T, T): every query sees the keys up to itself, at
    positions 0 … T-1 (a sliding-window layer would see fewer keys than assumed here)."""

    probs: torch.Tensor
    tokens: list[int]
    implementation: str = "genprobe"
    note: str | None = None

    @property
    def n_layer(self) -> int:
        """Number of layers captured."""
        return int(self.probs.shape[0])

    @property
    def n_head(self) -> int:
        """Heads per layer."""
        return int(self.probs.shape[1])


def is_hf_model(model) -> bool:
    """True for a ``transformers`` model (has a ``config`` with ``model_type``)."""
    return not isinstance(model, GPT) and hasattr(getattr(model, "config", None), "model_type")


def attn_implementation(model) -> str:
    """The attention implementation an HF model uses now (``eager``, ``sdpa``, ``flash_attention_2`` …)."""
    return str(getattr(model.config, "_attn_implementation", None) or "eager")


@torch.no_grad()
def hf_attentions(model, ids: torch.Tensor) -> tuple[list, str | None]:
    """Per-layer (B, H, T, T) attention of an HF model, switching to eager for the call if needed."""
    impl = attn_implementation(model)
    note = None
    if impl != "eager":
        try:
            set_attn_implementation(model, "eager")
        except Exception as exc:  # noqa: BLE001 - any refusal means "cannot return weights"
            raise AttentionUnavailableError(
                f"attention implementation {impl!r} cannot return attention weights and the model refused to "
                f"switch to 'eager' ({exc}); reload it with attn_implementation='eager'"
            ) from None
        note = f"model used attn_implementation={impl!r}, which returns no weights; switched to 'eager' for capture"
    try:
        out = model(input_ids=ids, output_attentions=True, use_cache=False)
    finally:
        if impl != "eager":
            set_attn_implementation(model, impl)
    att = getattr(out, "attentions", None)
    if not att or any(a is None for a in att):
        raise AttentionUnavailableError(
            f"model {type(model).__name__} (attn_implementation={attn_implementation(model)!r}) returned no attention "
            "weights with output_attentions=True; load it with attn_implementation='eager'"
        )
    return list(att), note


@torch.no_grad()
def capture_attention(
    model_like, ids: list[int] | torch.Tensor, max_bytes: int = MAX_CAPTURE_BYTES
) -> AttentionCapture:
    """Attention probabilities of one unpadded sequence ``ids`` through every layer and head; ``ValueError`` when the
    maps would exceed ``max_bytes`` (layers × heads × T² × 4 bytes)."""
    model = unwrap(model_like)
    x = torch.as_tensor(ids, dtype=torch.long).reshape(1, -1)
    T = x.shape[1]
    if T == 0:
        raise ValueError("need at least one token to capture attention")
    if not (isinstance(model, GPT) or is_hf_model(model)):
        raise ValueError(f"cannot capture attention from {type(model).__name__}: not a GPT nor a transformers model")
    cfg = model.cfg if isinstance(model, GPT) else model.config
    n_layer = int(getattr(cfg, "n_layer", None) or getattr(cfg, "num_hidden_layers", 0) or 0)
    n_head = int(getattr(cfg, "n_head", None) or getattr(cfg, "num_attention_heads", 0) or 0)
    if (need := capture_bytes(n_layer, n_head, T)) > max_bytes:
        raise ValueError(
            f"capturing attention over {T} tokens needs {need / 2**30:.1f} GiB "
            f"({n_layer} layers × {n_head} heads × {T}² float32), over the {max_bytes / 2**30:.1f} GiB limit; "
            "use a shorter prompt"
        )
    x = x.to(next(model.parameters()).device)
    if isinstance(model, GPT):
        store: list = []
        model(x, attn_store=store)
        probs = torch.stack([p[0].float().cpu() for p in store])
        return AttentionCapture(probs, x[0].tolist())
    att, note = hf_attentions(model, x)
    return AttentionCapture(_stack_releasing(att), x[0].tolist(), implementation="eager", note=note)


def _stack_releasing(att: list) -> torch.Tensor:
    """(L, H, T, T) float32 on the CPU from per-layer (1, H, T, T) maps, dropping each layer once copied:
    the peak stays near one copy of the maps instead of two."""
    probs = torch.empty((len(att), *att[0].shape[1:]), dtype=torch.float32)
    for i in range(len(att)):
        probs[i] = att[i][0].detach().float().cpu()
        att[i] = None
    return probs
