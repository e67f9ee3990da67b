"""Exact conversion between the reference GPT and ``transformers.GPT2LMHeadModel`` (no network, no pickle), and
the switch that keeps transformers' own progress bars quiet while genprobe loads or writes its models."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .config import GPTConfig
from .errors import ModelLoadError
from .gpt import GPT

if TYPE_CHECKING:  # transformers is imported lazily at run time (optional, slow to import)
    from transformers import GPT2LMHeadModel

# Our nn.Linear stores (out, in); GPT-2's Conv1D stores (in, out): these weights are transposed.
_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Hide transformers' own weight-loading/writing progress bars (restores the setting)."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # transformers: unannotated
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]  # transformers: unannotated


def from_pretrained(loader: Any, d: Path, what: str, **kw: Any) -> Any:
    """``loader.from_pretrained(d, **kw)`` (a model or tokenizer class) as genprobe loads everything: offline, never
    ``trust_remote_code``, progress bars hidden; a :class:`ModelLoadError` naming ``d`` and ``what`` when it fails."""
    try:
        with quiet_transformers():
            return loader.from_pretrained(d, local_files_only=True, trust_remote_code=False, **kw)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, ImportError) as exc:
        raise ModelLoadError(f"{d}: transformers could not load {what} ({type(exc).__name__}: {exc})") from None


def set_attn_implementation(model: Any, impl: str) -> None:
    """Switch a transformers model's attention implementation (``eager``, ``sdpa`` …); raises when it refuses."""
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(impl)
    else:  # pragma: no cover - older transformers: the config attribute
        model.config._attn_implementation = impl


def _is_mask_buffer(key: str) -> bool:
    """Old GPT-2 checkpoints carry causal-mask buffers ``h.N.attn.bias`` / ``masked_bias``: not weights."""
    parts = key.split(".")
    return len(parts) >= 2 and parts[-2] == "attn" and parts[-1] in ("bias", "masked_bias")


def _converted(state: dict[str, torch.Tensor], rename: Callable[[str], str | None]) -> dict[str, torch.Tensor]:
    """Copies of ``state``'s tensors under ``rename(key)`` (None: left out), the Conv1D weights transposed."""
    out = {}
    for k, v in state.items():
        name = rename(k)
        if name is not None:
            w = v.detach().clone()
            out[name] = w.t().contiguous() if k.endswith(_CONV1D) else w
    return out


def to_hf_gpt2(model: GPT, attn_implementation: str = "eager") -> GPT2LMHeadModel:
    """A ``GPT2LMHeadModel`` (eval mode) holding exactly ``model``'s weights (learned positions only)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = model.cfg
    if cfg.pos_encoding != "learned":
        raise ValueError(f"only pos_encoding='learned' maps onto GPT2LMHeadModel; this model uses {cfg.pos_encoding!r}")
    config = GPT2Config(
        vocab_size=cfg.vocab_size,
        n_positions=cfg.block_size,
        n_embd=cfg.d_model,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        n_inner=cfg.d_ff,
        activation_function="gelu_new",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        layer_norm_epsilon=cfg.layer_norm_eps,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
    )
    # transformers overrides Module.eval() without annotations: a stub gap, not an untyped call of ours.
    hf: GPT2LMHeadModel = GPT2LMHeadModel(config).eval()  # type: ignore[no-untyped-call]
    set_attn_implementation(hf, attn_implementation)
    sd = _converted(model.state_dict(), lambda k: None if k == "lm_head.weight" else f"transformer.{k}")
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    missing = [m for m in missing if not _is_mask_buffer(m) and m != "lm_head.weight"]
    if missing or unexpected:
        raise RuntimeError(f"GPT-2 conversion mismatch: missing {missing}, unexpected {unexpected}")
    hf.tie_weights()
    return hf


def from_hf_gpt2(hf: GPT2LMHeadModel) -> GPT:
    """The reference GPT holding exactly a ``GPT2LMHeadModel``'s weights."""
    c = hf.config
    if getattr(c, "model_type", None) != "gpt2":
        raise ValueError(f"expected a GPT-2 model, got model_type {getattr(c, 'model_type', None)!r}")
    act = getattr(c, "activation_function", "gelu_new")
    if act not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ValueError(f"GPT-2 activation {act!r} is not the tanh GELU the reference GPT uses")
    cfg = GPTConfig(
        vocab_size=c.vocab_size,
        n_layer=c.n_layer,
        n_head=c.n_head,
        d_model=c.n_embd,
        d_ff=c.n_inner or 4 * c.n_embd,
        block_size=c.n_positions,
        pos_encoding="learned",
        layer_norm_eps=c.layer_norm_epsilon,
    )
    model = GPT(cfg)
    prefix = "transformer."
    sd = _converted(
        hf.state_dict(), lambda k: k[len(prefix) :] if k.startswith(prefix) and not _is_mask_buffer(k) else None
    )
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [m for m in missing if m != "lm_head.weight"]
    if missing or unexpected:
        raise ValueError(f"GPT-2 weights do not fit: missing {missing}, unexpected {unexpected}")
    return model.eval()
