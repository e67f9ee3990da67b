"""The Llama family's forward over a ``transformers`` model's own weights: what the fast path compiles for it.

Llama, Qwen2, Qwen3, Mistral and Phi-3 share one decoder (RMSNorm, rotary positions, grouped-query attention, SwiGLU,
a final RMSNorm before an often tied head); their differences are fields of :class:`LlamaFamilyConfig` (q/k/v biases,
Qwen3's query/key norms, sliding windows per layer, Phi-3's fused projections, partial rotary, RoPE scaling that does
not depend on the sequence length). :class:`LlamaFamily` is built *around* the model: its submodules are the model's
own, so nothing is copied, an in-place loop patch is seen and a weight-only conversion is what it runs. Its forward
is genprobe's position-driven one (:class:`~genprobe.model.position_lm.PositionDrivenLM`), so the engine's caches and
compiled runner drive it as they drive our GPT; the maths is ``transformers``' eager code's, except that grouped
queries read each key/value head once instead of ``repeat_kv``'s copies.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn as nn
import torch.nn.functional as F

from .cache_protocol import CacheLike
from .position_lm import PositionDrivenLM, rotate

#: ``model_type`` values whose decoder is this one (the architecture matrix's Llama-family rows, and Qwen3).
FAMILY = ("llama", "qwen2", "qwen3", "mistral", "phi3")

# RoPE types whose frequencies change with the sequence length (recomputed by transformers' dynamic_rope_update):
# one precomputed inv_freq cannot follow them.
_LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")


@dataclass(frozen=True)
class LlamaFamilyConfig:
    """The shape of a Llama-family decoder, read off a ``transformers`` config (hashable: compiled graphs key on it)."""

    arch: str
    vocab_size: int
    n_layer: int
    n_head: int
    n_kv_head: int
    d_head: int
    d_model: int
    block_size: int  # max_position_embeddings: the context the config declares
    windows: tuple[int | None, ...]  # per layer: its sliding window, None for full attention
    qk_norm: bool
    fused: bool  # Phi-3: qkv_proj and gate_up_proj
    rotary_dim: int
    attention_scaling: float  # RoPE scaling's factor on cos and sin (1 unless e.g. YaRN)
    pos_encoding: str = "rope"

    @property
    def max_positions(self) -> int:
        """The context length the config declares (what ``transformers``' runner refuses beyond, here too)."""
        return self.block_size

    @property
    def scaling(self) -> float:
        """The attention scores' scale, ``d_head ** -0.5`` as every family member sets it."""
        return 1.0 / math.sqrt(self.d_head)


def unsupported_reason(hf_model: Any) -> str | None:
    """Why ``hf_model`` cannot run on :class:`LlamaFamily` (None when it can)."""
    cfg = getattr(hf_model, "config", None)
    arch = getattr(cfg, "model_type", None)
    if arch not in FAMILY:
        return f"model_type {arch!r} is not in the Llama family the fast path covers ({', '.join(FAMILY)})"
    act = getattr(cfg, "hidden_act", "silu")
    if act != "silu":
        return f"hidden_act {act!r}: the family's MLP is SwiGLU (silu)"
    rope = getattr(cfg, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") in _LENGTH_DEPENDENT_ROPE:
        return f"rope_type {rope['rope_type']!r} changes its frequencies with the sequence length"
    rotary = getattr(getattr(hf_model, "model", None), "rotary_emb", None)
    if rotary is None or not hasattr(rotary, "inv_freq"):
        return "the model has no rotary module with inv_freq where transformers' Llama family keeps one"
    return None


def config_of(hf_model: Any) -> LlamaFamilyConfig:
    """The :class:`LlamaFamilyConfig` of a supported ``transformers`` model (see :func:`unsupported_reason`)."""
    c = hf_model.config
    n_head = c.num_attention_heads
    d_head = getattr(c, "head_dim", None) or c.hidden_size // n_head
    rotary = hf_model.model.rotary_emb
    types = getattr(c, "layer_types", None) or ["full_attention"] * c.num_hidden_layers
    window = getattr(c, "sliding_window", None)
    if getattr(c, "use_sliding_window", True) is False:
        window = None
    windows = tuple(window if (t == "sliding_attention" or c.model_type == "mistral") else None for t in types)
    return LlamaFamilyConfig(
        arch=c.model_type,
        vocab_size=int(hf_model.get_output_embeddings().weight.shape[0]),
        n_layer=c.num_hidden_layers,
        n_head=n_head,
        n_kv_head=getattr(c, "num_key_value_heads", None) or n_head,
        d_head=d_head,
        d_model=c.hidden_size,
        block_size=int(c.max_position_embeddings),
        windows=windows,
        qk_norm=c.model_type == "qwen3",
        fused=c.model_type == "phi3",
        rotary_dim=2 * int(rotary.inv_freq.numel()),
        attention_scaling=float(getattr(rotary, "attention_scaling", 1.0)),
    )


class FamilyLayer(nn.Module):
    """One decoder layer: the ``transformers`` layer's own norms and projections, called in the family's order."""

    def __init__(self, hf_layer: Any, cfg: LlamaFamilyConfig):
        super().__init__()
        attn, mlp = hf_layer.self_attn, hf_layer.mlp
        self.input_norm, self.post_norm = hf_layer.input_layernorm, hf_layer.post_attention_layernorm
        if cfg.fused:
            self.qkv_proj, self.gate_up_proj = attn.qkv_proj, mlp.gate_up_proj
        else:
            self.q_proj, self.k_proj, self.v_proj = attn.q_proj, attn.k_proj, attn.v_proj
            self.gate_proj, self.up_proj = mlp.gate_proj, mlp.up_proj
        if cfg.qk_norm:
            self.q_norm, self.k_norm = attn.q_norm, attn.k_norm
        self.o_proj, self.down_proj = attn.o_proj, mlp.down_proj

    def qkv(self, x: torch.Tensor, cfg: LlamaFamilyConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries (B, T, H, Dh), keys and values (B, T, KV, Dh) of ``x`` (B, T, C), query/key norms applied."""
        B, T, _ = x.shape
        H, KV, Dh = cfg.n_head, cfg.n_kv_head, cfg.d_head
        if cfg.fused:
            q, k, v = self.qkv_proj(x).split([H * Dh, KV * Dh, KV * Dh], dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q, k, v = q.view(B, T, H, Dh), k.view(B, T, KV, Dh), v.view(B, T, KV, Dh)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v

    def mlp(self, x: torch.Tensor, cfg: LlamaFamilyConfig) -> torch.Tensor:
        """SwiGLU: ``down(silu(gate(x)) * up(x))``."""
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1) if cfg.fused else (self.gate_proj(x), self.up_proj(x))
        out: torch.Tensor = self.down_proj(F.silu(gate) * up)
        return out


def grouped_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scaling: float
) -> torch.Tensor:
    """Softmax attention of ``q`` (B, H, T, Dh) over ``k``/``v`` (B, KV, S, Dh), each KV head shared by H/KV queries.

    ``mask`` (B, 1, T, S) bool. Scores and softmax as ``transformers``' eager attention (softmax in float32). The
    G = H/KV queries of a group are stacked as G*T rows against their key head, so each product is a plain batched
    matmul over (B, KV): a matmul that broadcast one key head over G query heads would copy the keys and values G
    times per step (what ``repeat_kv`` does, and at batch 64 more bytes than the weights).
    """
    B, H, T, Dh = q.shape
    KV = k.shape[1]
    G = H // KV
    rows = q.reshape(B, KV, G * T, Dh)  # a group's queries are consecutive heads: row g*T + t
    scores = (rows @ k.transpose(-2, -1)) * scaling  # (B, KV, G*T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask.repeat(1, 1, G, 1), float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    # (B, KV, G, T, Dh) -> (B, H, T, Dh); T as -1: spelled out, torch.export cannot prove the split for every length
    return (probs @ v).reshape(B, KV, G, -1, Dh).flatten(1, 2)


class LlamaFamily(PositionDrivenLM):
    """A Llama-family ``transformers`` causal LM, run by genprobe's position-driven forward over its own weights."""

    def __init__(self, hf_model: Any):
        reason = unsupported_reason(hf_model)
        if reason is not None:
            raise ValueError(f"not a Llama-family model genprobe's fast path covers: {reason}")
        super().__init__()
        self.cfg = config_of(hf_model)
        inner = hf_model.model
        self.wte = inner.embed_tokens
        self.layers = nn.ModuleList(FamilyLayer(layer, self.cfg) for layer in inner.layers)
        self.norm = inner.norm
        self.lm_head = hf_model.get_output_embeddings()
        # The model's own frequencies (RoPE scaling applied by its rotary module), shared, not recomputed.
        self.register_buffer("inv_freq", inner.rotary_emb.inv_freq, persistent=False)
        self.training = hf_model.training  # its own flag only: .train()/.eval() here would switch the model's too

    def rotary(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin), (B, 1, T, rotary_dim), as the model's rotary module computes them for ``positions`` (B, T)."""
        inv_freq = self.get_buffer("inv_freq")
        freqs = positions[..., None].float() * inv_freq.float()
        emb = torch.cat([freqs, freqs], dim=-1)
        scale = self.cfg.attention_scaling
        return (emb.cos() * scale).to(dtype)[:, None], (emb.sin() * scale).to(dtype)[:, None]

    def forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        cache: CacheLike | None = None,
        attention_mask: torch.Tensor | None = None,
        logits_to_keep: int = 0,
    ) -> torch.Tensor:
        """Logits (B, T, V) for ``ids`` (B, T) at absolute ``positions``; the same arguments as ``GPT.forward``."""
        positions, valid, defaulted = self._checked_inputs(ids, positions, cache, attention_mask, logits_to_keep)
        masks = self._masks(positions, valid, cache, defaulted)
        x = self.wte(ids)
        cos, sin = self.rotary(positions, x.dtype)
        cfg = self.cfg
        B, T, C = x.shape
        for i, layer in enumerate(cast(list[FamilyLayer], self.layers)):
            q, k, v = layer.qkv(layer.input_norm(x), cfg)
            q, k, v = rotate(q.transpose(1, 2), cos, sin), rotate(k.transpose(1, 2), cos, sin), v.transpose(1, 2)
            if cache is not None:
                k, v = cache.write(i, k, v)
            y = grouped_attention(q, k, v, masks[cfg.windows[i]], cfg.scaling)
            x = x + layer.o_proj(y.transpose(1, 2).reshape(B, T, cfg.n_head * cfg.d_head))
            x = x + layer.mlp(layer.post_norm(x), cfg)
        if cache is not None:
            cache.commit()
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        logits: torch.Tensor = self.lm_head(self.norm(x))
        return logits

    def _masks(
        self, positions: torch.Tensor, valid: torch.Tensor | None, cache: CacheLike | None, defaulted: bool
    ) -> dict[int | None, torch.Tensor]:
        """One (B, 1, T, S) visibility mask per distinct window of the layers (None: full attention). With a cache,
        this call's keys are reserved in it first."""
        k_pos, k_valid = self._keys(positions, valid, cache, defaulted)
        return {
            w: self._visibility(positions, k_pos, k_valid, queries_real=valid is None, window=w)[:, None]
            for w in set(self.cfg.windows)
        }


# One view per transformers model (its submodules are the model's: building it twice would change nothing).
_views: weakref.WeakKeyDictionary[nn.Module, LlamaFamily] = weakref.WeakKeyDictionary()


def llama_family_of(hf_model: nn.Module) -> LlamaFamily:
    """The :class:`LlamaFamily` over ``hf_model`` (made once per model; ValueError naming why when unsupported)."""
    view = _views.get(hf_model)
    if view is None:
        view = _views[hf_model] = LlamaFamily(hf_model)
    return view
