"""Drive any ``transformers`` causal LM with genprobe's generation loop (and every sampler): the HF model keeps its
*own* cache (``DynamicCache``), we only supply the attention mask over everything seen so far and ``position_ids``
that count real tokens (left padding gets no position — the same rule our GPT uses, and what HF's ``generate`` does).
"""

from __future__ import annotations

import inspect
from typing import Any, cast

import torch
import torch.nn as nn

from ..model.load import max_positions, pad_id, vocab_size
from .cache import padded_positions


class _HFCacheState:
    """Per-generation state: HF's own cache + the key-validity mask of everything fed so far."""

    def __init__(self, cache: Any, batch_size: int, max_len: int, device: torch.device):
        self.cache = cache
        self.mask = torch.zeros(batch_size, max_len, dtype=torch.long, device=device)
        self.length = 0
        self.next_pos = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.padded = False

    def truncate(self, keep: int) -> None:
        """Keep the first ``keep`` tokens (speculative decoding's rollback): ``DynamicCache.crop`` plus our counters."""
        if self.padded:
            raise ValueError("a cache holding padding cannot be rolled back by token count")
        if not 0 <= keep <= self.length:
            raise ValueError(f"cannot keep {keep} tokens of a cache holding {self.length}")
        if keep < self.length:  # a negative count drops that many tokens (a positive one is deprecated)
            self.cache.crop(keep - self.length)
        self.mask[:, keep : self.length] = 0
        self.next_pos = self.next_pos - (self.length - keep)
        self.length = keep


class HFCausalLM:
    """A ``transformers`` causal LM behind the runner protocol (``step_with_hidden`` too, for contrastive search)."""

    def __init__(self, hf_model: nn.Module):
        self.model = hf_model.eval()
        self.config: Any = hf_model.config
        self.vocab_size = vocab_size(hf_model)
        self.max_positions = max_positions(hf_model)
        self.pad_id = pad_id(hf_model)
        params = inspect.signature(hf_model.forward).parameters
        # transformers >= 5.2x renamed ``past_key_values`` to ``cache``; support both.
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    def new_state(self, batch_size: int, max_len: int) -> _HFCacheState:
        """A fresh ``DynamicCache`` plus a preallocated attention-mask buffer."""
        from transformers import DynamicCache

        try:
            cache = DynamicCache(config=self.config)
        except TypeError:  # older transformers
            cache = DynamicCache()
        device = next(self.model.parameters()).device
        return _HFCacheState(cache, batch_size, max_len, device)

    def step(self, ids: torch.Tensor, valid: torch.Tensor | None, state: _HFCacheState) -> torch.Tensor:
        """Cached forward of new tokens (B, T) → logits (B, T, V); positions continue each row's real count."""
        return cast(torch.Tensor, self._cached_forward(ids, valid, state, hidden=False).logits)

    def step_with_hidden(
        self, ids: torch.Tensor, valid: torch.Tensor | None, state: _HFCacheState
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`step` plus the last hidden state after the final norm (``hidden_states[-1]``)."""
        out = self._cached_forward(ids, valid, state, hidden=True)
        return out.logits, out.hidden_states[-1]

    def _cached_forward(self, ids: torch.Tensor, valid: torch.Tensor | None, state: _HFCacheState, hidden: bool) -> Any:
        B, T = ids.shape
        end = state.length + T
        if end > state.mask.shape[1]:
            raise ValueError(f"HF cache state overflow: {state.length} + {T} > {state.mask.shape[1]}")
        state.mask[:, state.length : end] = 1 if valid is None else valid.to(torch.long)
        if valid is None:
            positions = state.next_pos[:, None] + torch.arange(T, device=ids.device)
        else:
            positions = padded_positions(state.next_pos, valid)
            state.padded = state.padded or not bool(valid.all())
        if self.max_positions is not None and int(positions.max()) >= self.max_positions:
            raise ValueError(
                f"context overflow: position {int(positions.max())} is beyond the model's context length "
                f"{self.max_positions} (n_positions / max_position_embeddings)"
            )
        kwargs = {self._cache_kw: state.cache, "use_cache": True, "position_ids": positions}
        if state.padded:
            kwargs["attention_mask"] = state.mask[:, :end]
        if hidden:
            kwargs["output_hidden_states"] = True
        out = self.model(input_ids=ids, **kwargs)
        state.length = end
        state.next_pos = state.next_pos + (T if valid is None else valid.to(torch.long).sum(1))
        return out

    def full(self, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Uncached forward of the whole (left-padded) sequence → logits (B, T, V)."""
        positions = padded_positions(torch.zeros(ids.shape[0], dtype=torch.long, device=ids.device), valid)
        out = self.model(input_ids=ids, attention_mask=valid.to(torch.long), position_ids=positions, use_cache=False)
        return cast(torch.Tensor, out.logits)
