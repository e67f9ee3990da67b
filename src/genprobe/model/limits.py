"""What a module accepts: its vocabulary size, context length and a safe padding id.

Read from the module itself (our GPT's config, or a ``transformers`` model's output embedding and config), so
a loaded :class:`~genprobe.model.load.Model` and the engine's runners report the same limits.
"""

from __future__ import annotations

from typing import Any

from .gpt import GPT


def vocab_size(module: Any) -> int:
    """Rows of the output embedding: what a token id must stay below."""
    if isinstance(module, GPT):
        return module.cfg.vocab_size
    out_emb = module.get_output_embeddings() if hasattr(module, "get_output_embeddings") else None
    return int(out_emb.weight.shape[0]) if out_emb is not None else int(module.config.vocab_size)


def max_positions(module: Any) -> int | None:
    """Hard context length (learned positions, or the config's), None when positions are unbounded."""
    if isinstance(module, GPT):
        return module.cfg.block_size if module.cfg.pos_encoding == "learned" else None
    c = module.config
    positions = getattr(c, "n_positions", None) or getattr(c, "max_position_embeddings", None)
    return None if positions is None else int(positions)


def pad_id(module: Any) -> int:
    """An id to fill left padding with (never attended to): the config's pad token when it is in range, else 0."""
    if isinstance(module, GPT):
        return 0
    pad = getattr(module.config, "pad_token_id", None)
    return int(pad) if pad is not None and 0 <= int(pad) < vocab_size(module) else 0
