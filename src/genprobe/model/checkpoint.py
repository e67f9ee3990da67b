"""Checkpoint directory = ``model.safetensors`` + ``genprobe.json`` (config, vocabulary, summary, hashes).

Loading never unpickles: weights come from safetensors, metadata from JSON. Both files are written
atomically (temp file + rename), weights first, and the JSON (which records the weights' sha256) is
the commit point. Until it is renamed, the previous weights stay reachable as a hard link
``.model.safetensors.prev``: a failed save rolls back to them, and after a hard crash between the two
renames the loader finds the weights whose sha256 the (old) JSON names there — so an interrupted
save always leaves the previous checkpoint loadable.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .._io import atomic_write_json, json_safe, read_format_json, sha256_file, temp_beside
from ..corpus.tokenizer import CharTokenizer
from .config import GPTConfig
from .gpt import GPT

WEIGHTS = "model.safetensors"
PREV_WEIGHTS = ".model.safetensors.prev"  # previous weights, kept only while a save is in flight
META = "genprobe.json"
FORMAT = "genprobe-checkpoint-v1"


class CheckpointError(ValueError):
    """A checkpoint directory is missing, corrupt, or does not match what it is loaded into."""


def _state_for_save(model: GPT) -> dict[str, torch.Tensor]:
    # lm_head.weight is tied to wte.weight: store it once (safetensors refuses shared storage).
    return {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}


def save_checkpoint(
    directory: str | os.PathLike[str], model: GPT, tokenizer: CharTokenizer, summary: dict[str, Any] | None = None
) -> Path:
    """Write ``model`` + ``tokenizer`` (+ training summary) to ``directory`` atomically."""
    if tokenizer.vocab_size != model.cfg.vocab_size:
        raise CheckpointError(
            f"tokenizer has {tokenizer.vocab_size} ids but the model's vocab_size is {model.cfg.vocab_size}"
        )
    d = Path(directory)
    state = _state_for_save(model)
    weights, prev = d / WEIGHTS, d / PREV_WEIGHTS
    w_tmp = temp_beside(weights)
    try:
        save_file(state, w_tmp, metadata={"format": FORMAT})
        with open(w_tmp, "rb") as fh:
            os.fsync(fh.fileno())
        meta = {
            "format": FORMAT,
            "config": json_safe(model.cfg),
            "tokenizer": json_safe(tokenizer),
            "tokenizer_sha256": tokenizer.fingerprint,
            "weights_sha256": sha256_file(w_tmp),
            "parameters": model.num_parameters(),
            "summary": summary or {},
        }
        json.dumps(meta, allow_nan=False)  # fail on a bad summary before anything on disk changes
        # Keep the committed weights reachable as ``prev`` (hard link, copy where links are unsupported), unless an
        # earlier save crashed mid-way and ``prev`` already holds them.
        try:
            committed: str | None = json.loads((d / META).read_text(encoding="utf-8"))["weights_sha256"]
        except (OSError, ValueError, KeyError, TypeError):
            committed = None
        held = prev.exists() and committed is not None and sha256_file(prev) == committed
        if not held or (weights.exists() and sha256_file(weights) == committed):
            prev.unlink(missing_ok=True)
            if weights.exists():
                try:
                    os.link(weights, prev)
                except OSError:
                    shutil.copy2(weights, prev)
        try:
            os.replace(w_tmp, weights)
            atomic_write_json(d / META, meta)  # commit point
        except BaseException:
            if prev.exists():  # roll back: the old JSON still names the old weights
                if weights.exists() and os.path.samefile(prev, weights):
                    prev.unlink()  # weights never replaced (rename onto the same inode is a no-op)
                else:
                    os.replace(prev, weights)
            raise
    finally:
        w_tmp.unlink(missing_ok=True)
    if prev.exists():
        prev.unlink()
    return d


def read_meta(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and sanity-check ``genprobe.json`` of a checkpoint directory."""
    d = Path(directory)
    if not d.exists():
        raise CheckpointError(f"checkpoint directory does not exist: {d}")
    if not (d / META).is_file():
        raise CheckpointError(f"{d} is not a genprobe checkpoint: {META} is missing")
    return read_format_json(d / META, FORMAT, CheckpointError)


def load_checkpoint(
    directory: str | os.PathLike[str], expect_tokenizer: CharTokenizer | None = None, device: str = "cpu"
) -> tuple[GPT, CharTokenizer, dict[str, Any]]:
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
    model, wp, expected_sha256 = GPT(cfg), Path(directory) / WEIGHTS, meta.get("weights_sha256")
    if not wp.exists():
        raise CheckpointError(f"weights file missing: {wp}")
    if expected_sha256 is not None:
        actual = sha256_file(wp)
        prev = Path(directory) / PREV_WEIGHTS
        if actual != expected_sha256 and prev.is_file() and sha256_file(prev) == expected_sha256:
            # A save crashed between its two renames: the JSON still describes the previous weights.
            wp, actual = prev, expected_sha256
        if actual != expected_sha256:
            raise CheckpointError(
                f"{wp}: sha256 {actual[:12]}… does not match the recorded {expected_sha256[:12]}… "
                "(truncated or replaced weights file)"
            )
    try:  # safetensors only, refusing truncated files and any shape/key mismatch
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
    return model.to(device).eval(), tok, meta


def is_checkpoint(directory: str | os.PathLike[str]) -> bool:
    """True when ``directory`` holds a genprobe checkpoint (both files present)."""
    d = Path(directory)
    return (d / META).is_file() and (d / WEIGHTS).is_file()
