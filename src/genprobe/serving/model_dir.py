"""What vLLM loads: a transformers directory. A genprobe checkpoint is exported to one first.

vLLM reads ``config.json`` + ``*.safetensors`` (genprobe tokenizes: the engine starts without a tokenizer). Our
checkpoints are exported with :func:`genprobe.model.hf_dir.export_hf_dir` (the exact GPT-2 conversion) into a
temporary directory that lives as long as the :class:`ServedModel` (removed by ``cleanup()``, or when the object is
collected or the process exits: an engine that holds it keeps it).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..model.load import check_weights_files


@dataclass
class ServedModel:
    """A transformers directory vLLM can load, and where it came from."""

    path: Path  # the directory handed to vLLM
    source: Path  # what the user named (checkpoint or HF dir)
    kind: str  # "genprobe" (exported) | "hf"
    vocab_size: int
    max_positions: int | None
    _tmp: Path | None = field(default=None, repr=False)
    _removal: weakref.finalize | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self._tmp is not None:
            self._removal = weakref.finalize(self, shutil.rmtree, self._tmp, ignore_errors=True)

    def cleanup(self) -> None:
        """Remove the temporary export now (no-op for a directory the user gave, or when already removed)."""
        if self._removal is not None:
            self._removal()


def read_config(d: str | os.PathLike) -> Any:
    """A transformers directory's ``config.json``; a ``ValueError`` naming the file when it cannot be read."""
    path = Path(d) / "config.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} cannot be read as JSON ({exc})") from None


def _hf_limits(d: Path) -> tuple[int, int | None]:
    cfg = read_config(d)
    vocab = cfg.get("vocab_size")
    if not isinstance(vocab, int) or vocab < 1:
        raise ValueError(f"{d / 'config.json'} has no usable vocab_size")
    pos = cfg.get("n_positions") or cfg.get("max_position_embeddings")
    return vocab, (int(pos) if pos else None)


def _model_path(model: str | os.PathLike) -> Path:
    """The directory behind ``model``: a path, or a fetched catalog model's name (``smollm2``). A GGUF file is
    refused with the conversion command: vLLM is given the float directory genprobe compares against."""
    from ..model.catalog import CATALOG, resolve_name

    src = Path(model)
    if not src.exists():
        if str(model) in CATALOG:
            return resolve_name(str(model))
        raise FileNotFoundError(f"no such model directory: {src}")
    ggufs = [src] if src.is_file() else sorted(src.glob("*.gguf"))
    if src.suffix == ".gguf" or (ggufs and not (src / "config.json").is_file()):
        raise ValueError(
            f"{src} is a GGUF model: convert it once with `genprobe convert-gguf {ggufs[0]} --out DIR` and serve DIR "
            "(the float directory is what the served logits are compared with)"
        )
    return src


def served_model(model: str | os.PathLike, tmp_root: str | os.PathLike | None = None) -> ServedModel:
    """A transformers directory for ``model`` (an HF dir as is; a genprobe checkpoint exported to a temp dir)."""
    from ..model.checkpoint import is_checkpoint

    src = _model_path(model)
    if is_checkpoint(src):
        from ..model.hf_dir import export_hf_dir

        tmp = Path(tempfile.mkdtemp(prefix="genprobe-serve-", dir=tmp_root))
        try:
            export_hf_dir(src, tmp / "hf", overwrite=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        vocab, pos = _hf_limits(tmp / "hf")
        return ServedModel(tmp / "hf", src, "genprobe", vocab, pos, tmp)
    if not (src / "config.json").is_file():
        raise ValueError(
            f"{src} is neither a genprobe checkpoint (genprobe.json + model.safetensors) nor a transformers model "
            "directory (config.json + *.safetensors)"
        )
    check_weights_files(src)
    vocab, pos = _hf_limits(src)
    return ServedModel(src, src, "hf", vocab, pos)
