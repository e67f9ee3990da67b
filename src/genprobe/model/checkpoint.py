"""Checkpoint directory = ``model.safetensors`` + ``genprobe.json`` (config, vocabulary, summary, hashes).

Loading never unpickles: weights come from safetensors, metadata from JSON. Both files are written
atomically (temp file + rename), weights first, so a crash at any point leaves either the previous
checkpoint or the new one — and the JSON's sha256 of the weights catches a torn pair.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .._io import atomic_write, atomic_write_json, sha256_file
from ..corpus.tokenizer import CharTokenizer
from .config import GPTConfig
from .gpt import GPT

WEIGHTS = "model.safetensors"
META = "genprobe.json"
FORMAT = "genprobe-checkpoint-v1"


class CheckpointError(ValueError):
    """A checkpoint directory is missing, corrupt, or does not match what it is loaded into."""


def _state_for_save(model: GPT) -> dict[str, torch.Tensor]:
    # lm_head.weight is tied to wte.weight: store it once (safetensors refuses shared storage).
    return {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}


def save_checkpoint(
    directory: str | os.PathLike, model: GPT, tokenizer: CharTokenizer, summary: dict[str, Any] | None = None
) -> Path:
    """Write ``model`` + ``tokenizer`` (+ training summary) to ``directory`` atomically."""
    if tokenizer.vocab_size != model.cfg.vocab_size:
        raise CheckpointError(
            f"tokenizer has {tokenizer.vocab_size} ids but the model's vocab_size is {model.cfg.vocab_size}"
        )
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    state = _state_for_save(model)
    atomic_write(d / WEIGHTS, lambda tmp: save_file(state, tmp, metadata={"format": FORMAT}))
    meta = {
        "format": FORMAT,
        "config": model.cfg.to_dict(),
        "tokenizer": tokenizer.to_dict(),
        "tokenizer_sha256": tokenizer.fingerprint,
        "weights_sha256": sha256_file(d / WEIGHTS),
        "parameters": model.num_parameters(),
        "summary": summary or {},
    }
    atomic_write_json(d / META, meta)
    return d


def read_meta(directory: str | os.PathLike) -> dict:
    """Read and sanity-check ``genprobe.json`` of a checkpoint directory."""
    d = Path(directory)
    if not d.exists():
        raise CheckpointError(f"checkpoint directory does not exist: {d}")
    if not d.is_dir():
        raise CheckpointError(f"checkpoint path is not a directory: {d}")
    mp = d / META
    if not mp.exists():
        raise CheckpointError(f"{d} is not a genprobe checkpoint: {META} is missing")
    try:
        meta = json.loads(mp.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{mp} is not valid JSON: {exc}") from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{mp}: unknown format {meta.get('format')!r}, expected {FORMAT!r}")
    return meta


def load_weights_into(model: GPT, directory: str | os.PathLike, expected_sha256: str | None = None) -> None:
    """Load safetensors weights into ``model``, refusing truncated files and any shape/key mismatch."""
    wp = Path(directory) / WEIGHTS
    if not wp.exists():
        raise CheckpointError(f"weights file missing: {wp}")
    if expected_sha256 is not None:
        actual = sha256_file(wp)
        if actual != expected_sha256:
            raise CheckpointError(
                f"{wp}: sha256 {actual[:12]}… does not match the recorded {expected_sha256[:12]}… "
                "(truncated or replaced weights file)"
            )
    try:
        state = load_file(str(wp))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{wp} is not a readable safetensors file ({exc})") from None
    own = _state_for_save(model)
    missing = sorted(set(own) - set(state))
    extra = sorted(set(state) - set(own))
    if missing or extra:
        raise CheckpointError(f"{wp}: weights do not fit this model (missing {missing[:5]}, unexpected {extra[:5]})")
    for k, v in state.items():
        if tuple(v.shape) != tuple(own[k].shape):
            raise CheckpointError(
                f"{wp}: tensor {k} has shape {tuple(v.shape)}, the model expects {tuple(own[k].shape)} "
                "(mismatched vocabulary or config)"
            )
    model.load_state_dict(state, strict=False)


def load_checkpoint(
    directory: str | os.PathLike, expect_tokenizer: CharTokenizer | None = None, device: str = "cpu"
) -> tuple[GPT, CharTokenizer, dict]:
    """Load (model in eval mode, tokenizer, metadata); refuse a vocabulary other than ``expect_tokenizer``."""
    meta = read_meta(directory)
    try:
        cfg = GPTConfig.from_dict(meta["config"])
        tok = CharTokenizer.from_dict(meta["tokenizer"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{directory}: invalid config or vocabulary in {META} ({exc})") from None
    if tok.vocab_size != cfg.vocab_size:
        raise CheckpointError(
            f"{directory}: vocabulary has {tok.vocab_size} ids but config.vocab_size is {cfg.vocab_size}"
        )
    if expect_tokenizer is not None and expect_tokenizer.fingerprint != tok.fingerprint:
        raise CheckpointError(
            f"{directory}: vocabulary mismatch — the checkpoint's {tok.vocab_size}-id vocabulary differs from "
            f"the expected {expect_tokenizer.vocab_size}-id one (fingerprints {tok.fingerprint[:12]}… vs "
            f"{expect_tokenizer.fingerprint[:12]}…)"
        )
    model = GPT(cfg)
    load_weights_into(model, directory, meta.get("weights_sha256"))
    return model.to(device).eval(), tok, meta


def is_checkpoint(directory: str | os.PathLike) -> bool:
    """True when ``directory`` holds a genprobe checkpoint (both files present)."""
    d = Path(directory)
    return (d / META).is_file() and (d / WEIGHTS).is_file()
