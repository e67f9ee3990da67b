"""Apply a loop patch to a ``transformers`` model directory, and revert it, bit for bit.

:func:`apply_to_dir` copies the directory and rewrites only the safetensors files holding an edited tensor;
:func:`revert_dir` writes the original columns back. Both check the loaded model's state hash against the patch,
the edited columns' current values, and the written directory's hash; the original files' sha256 are kept in
:data:`NOTE_FILE` so a revert reports whether it restored them exactly.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .._io import atomic_write, atomic_write_json, sha256_file
from .patch import Patch, PatchError, PatchTarget

NOTE_FILE = "genprobe_patch.json"
NOTE_FORMAT = "genprobe-hf-patch-note-v1"
INDEX_FILE = "model.safetensors.index.json"


@dataclass
class DirPatchResult:
    """What an apply or revert wrote: where, the resulting state hash, and the weight files' sha256."""

    action: str  # "apply" | "revert"
    source: str
    out: str
    state_sha256: str
    weight_files: dict[str, str]  # weight file name -> sha256 after writing
    matches_original: bool | None = None  # revert: rewritten files hash to the recorded originals
    notes: list[str] = field(default_factory=list)


def weight_map(model_dir: Path) -> dict[str, str]:
    """Tensor name -> safetensors file name (single file or sharded with an index)."""
    index = model_dir / INDEX_FILE
    if index.is_file():
        return dict(json.loads(index.read_text(encoding="utf-8"))["weight_map"])
    single = model_dir / "model.safetensors"
    if not single.is_file():
        raise PatchError(f"{model_dir}: no model.safetensors and no {INDEX_FILE}")
    with safe_open(str(single), "pt") as fh:
        return {k: single.name for k in fh.keys()}


def _file_key(names: dict[str, str], target: PatchTarget, base_prefix: str | None) -> str:
    """The stored name of a target (a checkpoint may omit the base-model prefix, e.g. GPT-2's ``transformer.``)."""
    for key in (target.name, target.name.removeprefix(f"{base_prefix}.") if base_prefix else target.name):
        if key in names:
            return key
    raise PatchError(f"patch target {target.name} is not stored in the model directory's safetensors files")


def _write_columns(w: torch.Tensor, t: PatchTarget, expect: torch.Tensor, values: torch.Tensor, where: str) -> None:
    if w.dtype != expect.dtype:
        raise PatchError(
            f"{where}: stored as {w.dtype} but the patch holds {expect.dtype} values; a patch made on a model "
            f"loaded in {expect.dtype} cannot be written into {w.dtype} weights exactly"
        )
    view = w[:, t.columns].T if t.layout == "linear" else w[t.columns, :]
    if not torch.equal(view, expect):
        raise PatchError(
            f"{where}: the edited columns do not hold the values the patch expects (another edit, or a different model)"
        )
    if t.layout == "linear":
        w[:, t.columns] = values.T
    else:
        w[t.columns, :] = values


def _rewrite_file(src: Path, dst: Path, edits: list[tuple[str, PatchTarget]], revert: bool) -> str:
    with safe_open(str(src), "pt") as fh:
        meta = fh.metadata()
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}
    for key, t in edits:
        expect, values = (t.new, t.original) if revert else (t.original, t.new)
        _write_columns(tensors[key], t, expect, values, f"{src.name}:{key}")
    atomic_write(dst, lambda tmp: save_file(tensors, tmp, metadata=meta))
    return sha256_file(dst)


def _copy_tree(src: Path, out: Path, skip: set[str]) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise PatchError(f"{out} exists and is not an empty directory; refusing to write a model into it")
    out.mkdir(parents=True, exist_ok=True)
    for p in sorted(src.iterdir()):
        if p.name in skip or p.name.startswith("."):
            continue
        if p.is_dir():
            shutil.copytree(p, out / p.name)
        else:
            shutil.copy2(p, out / p.name)


def _patch_dir(src: Path, patch: Patch, out: Path, revert: bool) -> tuple[dict[str, str], dict[str, str]]:
    """Rewrite the weight files holding targets (into ``out``); returns (original sha256s, rewritten sha256s)."""
    from ..model.load import load_model

    model = load_model(src)
    if model.kind != "hf":
        raise PatchError(f"{src} is a genprobe checkpoint, not a transformers directory")
    want = patch.meta.get("sha256_after" if revert else "sha256_before")
    have = model.state_sha256()
    if have != want:
        side = "patched" if revert else "original"
        raise PatchError(
            f"refusing to {'revert' if revert else 'apply'}: the weights in {src} (sha256 {have}) are not "
            f"the {side} weights of this patch ({'sha256_after' if revert else 'sha256_before'} {want})"
        )
    names = weight_map(src)
    base = getattr(model.module, "base_model_prefix", None)
    per_file: dict[str, list[tuple[str, PatchTarget]]] = {}
    for t in patch.targets:
        key = _file_key(names, t, base)
        per_file.setdefault(names[key], []).append((key, t))
    before = {f: sha256_file(src / f) for f in per_file}
    if out.resolve() != src.resolve():
        _copy_tree(src, out, skip=set(per_file) | {NOTE_FILE})
    after = {f: _rewrite_file(src / f, out / f, edits, revert) for f, edits in per_file.items()}
    return before, after


def _check_state(out: Path, want: str, what: str) -> str:
    from ..model.load import load_model

    have = load_model(out).state_sha256()
    if have != want:  # pragma: no cover - the column writes are exact
        raise PatchError(f"{out}: the written model's state sha256 {have} is not the patch's {what} {want}")
    return have


def apply_to_dir(src: str | os.PathLike, patch: Patch, out: str | os.PathLike) -> DirPatchResult:
    """Write a patched copy of a transformers directory to ``out`` (``out == src``: in place)."""
    src, out = Path(src), Path(out)
    before, after = _patch_dir(src, patch, out, revert=False)
    note = {
        "format": NOTE_FORMAT,
        "edit": patch.meta.get("edit"),
        "sha256_before": patch.meta["sha256_before"],
        "sha256_after": patch.meta["sha256_after"],
        "original_weight_files": before,
        "patched_weight_files": after,
    }
    atomic_write_json(out / NOTE_FILE, note)
    sha = _check_state(out, patch.meta["sha256_after"], "sha256_after")
    return DirPatchResult("apply", str(src), str(out), sha, after)


def revert_dir(src: str | os.PathLike, patch: Patch, out: str | os.PathLike) -> DirPatchResult:
    """Write the original weights of a patched transformers directory to ``out`` (``out == src``: in place)."""
    src, out = Path(src), Path(out)
    note_path = src / NOTE_FILE
    note = json.loads(note_path.read_text(encoding="utf-8")) if note_path.is_file() else None
    _, after = _patch_dir(src, patch, out, revert=True)
    if out.resolve() == src.resolve() and note_path.exists():
        note_path.unlink()
    sha = _check_state(out, patch.meta["sha256_before"], "sha256_before")
    result = DirPatchResult("revert", str(src), str(out), sha, after)
    if note is None or note.get("format") != NOTE_FORMAT:
        result.notes.append(
            f"{src} has no {NOTE_FILE}: the restored state hash is checked, the original file hashes are unknown"
        )
    else:
        result.matches_original = all(note["original_weight_files"].get(f) == h for f, h in after.items())
    return result
