"""Weight patches: selected columns of an MLP down-projection W (d_model × d_ff) edited along the unit loop
direction d of that layer's MLP output (:class:`EditSpec`, :func:`make_patch`), in one of two forms:

* ``subtract`` (the article's form): W[:, c] ← W[:, c] − α·d
* ``project`` (projection removal): W[:, c] ← W[:, c] − α·d·(dᵀW[:, c])   (α = 1 removes it exactly)

Saved as ``<name>.safetensors`` + ``<name>.json`` (with the model's state sha256 before and after, which
:func:`apply_patch` / :func:`revert_patch` check); :func:`patch_dir` patches a ``transformers`` directory
(docs/loop-repair.md, "Patches").
"""

from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from .._io import NOT_JSON, atomic_write, atomic_write_json, json_safe, read_format_json, sha256_file
from ..model.arch import all_columns, count_parameters, get_columns, mlp_sites, set_columns, state_sha256

FORMAT = "genprobe-loop-patch-v1"
TENSORS = ("columns", "original", "new", "direction")  # each target's tensors in the .safetensors file
FORMS = ("subtract", "project")


class PatchError(ValueError):
    """A patch does not fit the model it is applied to (hash mismatch, shapes, unknown tensors)."""


@dataclass
class PatchTarget:
    """Edited columns of one down-projection: W[:, columns] went from ``original`` to ``new`` (rows = columns)."""

    name: str
    layer: int
    layout: str
    columns: torch.Tensor  # (k,) int64 (select_columns' indices)
    original: torch.Tensor = field(metadata=NOT_JSON)  # (k, d_model)
    new: torch.Tensor = field(metadata=NOT_JSON)  # (k, d_model)
    direction: torch.Tensor = field(metadata=NOT_JSON)  # (d_model,) float32 (make_patch normalises it in float32)
    alpha: float = 0.0  # the absolute strength used in this tensor

    JSON_PROPERTIES = ("changed",)

    @property
    def changed(self) -> int:
        """Number of weights whose value actually changes."""
        return int((self.original != self.new).sum())


@dataclass
class Patch:
    """A set of column edits plus metadata (hashes are filled by :func:`apply_patch` / :func:`finalise`)."""

    targets: list[PatchTarget]
    meta: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The JSON side of the patch."""
        return self.meta | {"format": FORMAT, "targets": json_safe(self.targets)}


# ---- the edit ------------------------------------------------------------------------------
@dataclass(frozen=True)
class EditSpec:
    """One candidate edit: which layers, how many columns per layer, which form, what strength."""

    layers: tuple[int, ...]
    k: int
    form: str
    alpha: float

    def __post_init__(self) -> None:
        if self.form not in FORMS:
            raise ValueError(f"edit form must be one of {FORMS}, got {self.form!r}")
        if self.k < 1:
            raise ValueError(f"k (columns per layer) must be >= 1, got {self.k}")
        if not self.layers:
            raise ValueError("an edit needs at least one layer")
        if not (self.alpha == self.alpha) or self.alpha < 0:
            raise ValueError(f"alpha must be a finite number >= 0, got {self.alpha}")


def edit_columns(cols: torch.Tensor, d: torch.Tensor, alpha: float, form: str) -> torch.Tensor:
    """New values of columns given as rows ``cols`` (k, d_model) for unit direction ``d``."""
    d = (d / d.norm()).to(cols.dtype)
    if form == "subtract":
        return cols - alpha * d[None, :]
    if form == "project":
        return cols - alpha * (cols @ d)[:, None] * d[None, :]
    raise ValueError(f"edit form must be one of {FORMS}, got {form!r}")


def select_columns(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` highest scores, ascending index order (stable, for reproducible patches)."""
    if not 1 <= k <= scores.numel():
        raise ValueError(f"k must be in [1, {scores.numel()}] (d_ff), got {k}")
    return torch.topk(scores, k).indices.sort().values


def make_patch(
    model: Any,
    spec: EditSpec,
    directions: dict[int, torch.Tensor],
    unit_means: dict[int, torch.Tensor],
    gaps: dict[int, float] | None = None,
) -> Patch:
    """Build (do not apply) the patch for ``spec``: selected columns, their original and new values. With ``gaps``
    (layer -> loop-minus-reference gap of mean MLP output along d), ``subtract`` strengths are relative: α_abs = α ·
    gap / Σ_{c∈C} mean loop activation of c, so α = 1 removes the whole gap at an average loop position."""
    sites = mlp_sites(model)
    targets = []
    for layer in spec.layers:
        if not 0 <= layer < len(sites):
            raise ValueError(f"layer {layer} out of range: the model has {len(sites)} layers")
        site, d = sites[layer], directions[layer].float() / directions[layer].float().norm()
        # score_c = |dᵀW[:, c]| × (mean activation of unit c at loop positions); the mean is signed: a unit that is
        # on average negative in loops (GELU's small negative lobe, a gated unit) pushes the other way and scores low
        cols = select_columns((all_columns(site) @ d).abs() * unit_means[layer].float(), spec.k)
        orig = get_columns(site, cols)
        alpha = spec.alpha
        if gaps is not None and spec.form == "subtract":
            act = float(unit_means[layer].float()[cols].sum())
            if act <= 0:
                raise ValueError(
                    f"layer {layer}: selected columns have non-positive mean activation {act:.3g}; cannot scale alpha"
                )
            alpha = spec.alpha * gaps[layer] / act
        new = edit_columns(orig.float(), d, alpha, spec.form).to(orig.dtype)
        targets.append(PatchTarget(site.weight_name, layer, site.layout, cols, orig, new, d, float(alpha)))
    return Patch(targets=targets, meta={"edit": json_safe(spec)})


# ---- applying, reverting, saving ----------------------------------------------------------
def _site_for(model: Any, t: PatchTarget):
    sites = mlp_sites(model)
    if not 0 <= t.layer < len(sites) or sites[t.layer].weight_name != t.name:
        raise PatchError(f"patch target {t.name} (layer {t.layer}) does not exist in this model")
    s = sites[t.layer]
    if s.layout != t.layout or t.original.shape != (t.columns.numel(), s.d_model) or int(t.columns.max()) >= s.d_ff:
        raise PatchError(
            f"patch target {t.name}: shape/layout mismatch (patch {t.layout} columns {t.columns.numel()}×"
            f"{tuple(t.original.shape)}, model {s.layout} d_model={s.d_model} d_ff={s.d_ff})"
        )
    return s


def write_values(model: Any, patch: Patch, which: str) -> None:
    """Write ``which`` ("new" or "original") values of every target into the model, unchecked."""
    for t in patch.targets:
        set_columns(_site_for(model, t), t.columns, t.new if which == "new" else t.original)


@contextmanager
def written(model: Any, patch: Patch) -> Iterator[None]:
    """The patch's new values written for the block, the original ones always written back (unchecked, for the
    searches; :func:`patched` is the hash-checked form)."""
    write_values(model, patch, "new")
    try:
        yield
    finally:
        write_values(model, patch, "original")


@contextmanager
def patched(model: Any, patch: Patch) -> Iterator[None]:
    """:func:`apply_patch` for the block and always :func:`revert_patch` (both sha256-checked)."""
    apply_patch(model, patch)
    try:
        yield
    finally:
        revert_patch(model, patch)


def finalise(model: Any, patch: Patch) -> Patch:
    """Record before/after hashes and the fraction of weights changed (model left unchanged)."""
    before = state_sha256(model)
    with written(model, patch):
        after = state_sha256(model)
    changed = sum(t.changed for t in patch.targets)
    total = count_parameters(model)
    patch.meta.update(
        sha256_before=before,
        sha256_after=after,
        weights_changed=changed,
        total_parameters=total,
        fraction_changed=changed / total,
    )
    return patch


#: each direction of a patch: (verb, the hash the model must have, the hash it arrives at, what the first is)
_SWITCH = {
    "new": ("apply", "sha256_before", "sha256_after", "the ones this patch was made for"),
    "original": ("revert", "sha256_after", "sha256_before", "the patched weights"),
}


def _check_start(patch: Patch, which: str, have: str, weights: str) -> None:
    """Refuse to write the ``which`` values into ``weights`` (hash ``have``) unless the patch records that hash."""
    verb, start, _, what = _SWITCH[which]
    want = patch.meta.get(start)
    if not want:
        raise PatchError(f"patch has no recorded {start}; call finalise() on the model it was made for")
    if have != want:
        raise PatchError(f"refusing to {verb}: {weights} (sha256 {have}) are not {what} ({start} {want})")


def _switch(model: Any, patch: Patch, which: str) -> str:
    """Write the ``which`` values of every target, checking the state hash before and after (rolled back when it
    is not the recorded one). Returns the new hash."""
    verb, _, end, _ = _SWITCH[which]
    _check_start(patch, which, state_sha256(model), "the model's weights")
    for t in patch.targets:
        _site_for(model, t)
    write_values(model, patch, which)
    after = state_sha256(model)
    if after != patch.meta.get(end):  # the column writes are exact: only a hash recorded for other values lands here
        write_values(model, patch, "original" if which == "new" else "new")
        raise PatchError(f"{verb} produced sha256 {after}, not the recorded {end} {patch.meta.get(end)}; rolled back")
    return after


def apply_patch(model: Any, patch: Patch) -> str:
    """Apply in place; refuses unless the model's state hash equals the patch's "before". Returns the new hash."""
    return _switch(model, patch, "new")


def revert_patch(model: Any, patch: Patch) -> str:
    """Restore the original values exactly; refuses unless the model is the patched one; checks the "before" hash."""
    return _switch(model, patch, "original")


def _paths(path: str | os.PathLike) -> tuple[Path, Path]:
    p = Path(path)
    stem = p.with_suffix("") if p.suffix in (".json", ".safetensors") else p
    return stem.with_name(stem.name + ".safetensors"), stem.with_name(stem.name + ".json")


def save_patch(patch: Patch, path: str | os.PathLike) -> tuple[Path, Path]:
    """Write ``<path>.safetensors`` then ``<path>.json`` atomically (``path`` may carry either suffix)."""
    st, js = _paths(path)
    tensors = {f"target{i}.{k}": getattr(t, k).contiguous() for i, t in enumerate(patch.targets) for k in TENSORS}
    atomic_write(st, lambda tmp: save_file(tensors, tmp, metadata={"format": FORMAT}))
    atomic_write_json(js, json_safe(patch) | {"tensors_file": st.name, "tensors_sha256": sha256_file(st)})
    return st, js


def load_patch(path: str | os.PathLike) -> Patch:
    """Read a patch written by :func:`save_patch` (checks the tensors file's sha256)."""
    st, js = _paths(path)
    if not js.exists():
        raise FileNotFoundError(f"patch metadata not found: {js}")
    if not st.exists():
        raise FileNotFoundError(f"patch tensors not found: {st}")
    meta = read_format_json(js, FORMAT, PatchError)
    if meta.get("tensors_sha256") and sha256_file(st) != meta["tensors_sha256"]:
        raise PatchError(f"{st}: sha256 does not match the one recorded in {js.name} (replaced or truncated)")
    tensors = load_file(str(st))

    def target(i: int, td: dict) -> PatchTarget:
        cols, original, new, direction = (tensors[f"target{i}.{k}"] for k in TENSORS)
        return PatchTarget(td["name"], td["layer"], td["layout"], cols, original, new, direction, td.get("alpha", 0.0))

    targets = [target(i, td) for i, td in enumerate(meta["targets"])]
    rest = {k: v for k, v in meta.items() if k not in ("targets", "format", "tensors_file", "tensors_sha256")}
    return Patch(targets, rest)


# ---- transformers model directories ----------------------------------------------------------
NOTE_FILE = "genprobe_patch.json"
NOTE_FORMAT = "genprobe-hf-patch-note-v1"


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


def _rewrite_file(src: Path, dst: Path, edits: list[tuple[str, PatchTarget]], revert: bool) -> str:
    """Write ``src`` into ``dst`` with each target's columns replaced, checking they hold what the patch expects."""
    with safe_open(str(src), "pt") as fh:
        meta = fh.metadata()
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}
    for key, t in edits:
        w, where = tensors[key], f"{src.name}:{key}"
        expect, values = (t.new, t.original) if revert else (t.original, t.new)
        if w.dtype != expect.dtype:
            raise PatchError(
                f"{where}: stored as {w.dtype} but the patch holds {expect.dtype} values; a patch made on a model "
                f"loaded in {expect.dtype} cannot be written into {w.dtype} weights exactly"
            )
        view = w[:, t.columns].T if t.layout == "linear" else w[t.columns, :]
        if not torch.equal(view, expect):
            raise PatchError(
                f"{where}: the edited columns do not hold the values the patch expects (another edit, or a different "
                "model)"
            )
        if t.layout == "linear":
            w[:, t.columns] = values.T
        else:
            w[t.columns, :] = values
    atomic_write(dst, lambda tmp: save_file(tensors, tmp, metadata=meta))
    return sha256_file(dst)


def patch_dir(src: str | os.PathLike, patch: Patch, out: str | os.PathLike, revert: bool = False) -> DirPatchResult:
    """Write a patched copy of a transformers directory to ``out`` or (``revert``) the original weights of a patched
    one (``out == src``: in place), checked against the hashes :data:`NOTE_FILE` recorded."""
    from ..model.load import load_model

    src, out = Path(src), Path(out)
    verb, _, end, _ = _SWITCH["original" if revert else "new"]
    note_path = src / NOTE_FILE
    note = json.loads(note_path.read_text(encoding="utf-8")) if revert and note_path.is_file() else None
    model = load_model(src)
    if model.kind != "hf":
        raise PatchError(f"{src} is a genprobe checkpoint, not a transformers directory")
    _check_start(patch, "original" if revert else "new", model.state_sha256(), f"the weights in {src}")
    names: dict[str, str] = {}  # tensor name -> the safetensors file (single file or shards) that stores it
    for f in sorted(src.glob("*.safetensors")):
        with safe_open(str(f), "pt") as fh:
            names |= dict.fromkeys(fh.keys(), f.name)
    base = getattr(model.module, "base_model_prefix", None)
    del model  # the written directory is loaded below
    per_file: dict[str, list[tuple[str, PatchTarget]]] = {}
    for t in patch.targets:  # a checkpoint may omit the base-model prefix (e.g. GPT-2's ``transformer.``)
        key = next((k for k in (t.name, t.name.removeprefix(f"{base}.") if base else t.name) if k in names), None)
        if key is None:
            raise PatchError(f"patch target {t.name} is not stored in the model directory's safetensors files")
        per_file.setdefault(names[key], []).append((key, t))
    before = {f: sha256_file(src / f) for f in per_file}
    if out.resolve() != src.resolve():  # the rest copied, less (top level) the files rewritten below, note, dotfiles
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise PatchError(f"{out} exists and is not an empty directory; refusing to write a model into it")
        skip, top = set(per_file) | {NOTE_FILE}, os.fspath(src)
        shutil.copytree(src, out, ignore=lambda d, ns: [n for n in ns if d == top and (n in skip or n[0] == ".")])
    after = {f: _rewrite_file(src / f, out / f, edits, revert) for f, edits in per_file.items()}
    if not revert:
        kept = {k: patch.meta.get(k) for k in ("edit", "sha256_before", "sha256_after")}
        files = {"original_weight_files": before, "patched_weight_files": after}
        atomic_write_json(out / NOTE_FILE, {"format": NOTE_FORMAT, **kept, **files})
    elif out.resolve() == src.resolve() and note_path.exists():
        note_path.unlink()
    sha = load_model(out).state_sha256()
    if sha != patch.meta[end]:  # pragma: no cover - the column writes are exact
        raise PatchError(f"{out}: the written model's state sha256 {sha} is not the patch's {end} {patch.meta[end]}")
    result = DirPatchResult(verb, str(src), str(out), sha, after)
    if revert and (note is None or note.get("format") != NOTE_FORMAT):
        result.notes.append(
            f"{src} has no {NOTE_FILE}: the restored state hash is checked, the original file hashes are unknown"
        )
    elif note is not None:
        result.matches_original = all(note["original_weight_files"].get(f) == h for f, h in after.items())
    return result
