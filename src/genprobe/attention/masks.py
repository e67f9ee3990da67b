"""Validate ``input_ids`` / ``attention_mask`` (/ ``position_ids``) batches before they reach a model.

Rules (each :class:`Violation` names the row, the position — ``None`` for a whole-row finding — and the rule):

=====================  =======================================================================
``length_mismatch``    a row's ``attention_mask`` / ``position_ids`` length differs from ``input_ids``
``ragged_batch``       rows of different lengths (a batch must be rectangular)
``non_binary``         a mask value other than 0/1 (``True``/``False`` accepted)
``inverted_mask``      the mask is 1 exactly on the padding and 0 on the content
``pad_unmasked``       a ``pad_token_id`` position has mask 1 (if pad == eos this may be deliberate)
``mask_hole``          zeros in the middle of a row: padding must be one block at one end
``mixed_padding_side`` some rows padded on the left, others on the right
``empty_row``          no position has mask 1: the row's queries have no visible key
``positions``          ``position_ids`` of real tokens are not 0, 1, 2, … — with left padding this is
                       the textbook bug of positions counted from the tensor index, not from the first
                       real token (``positions_not_restarting``)
=====================  =======================================================================

The inverted-mask check is exact with ``pad_token_id``; without it, a row whose unmasked tokens are
all one repeated id while its masked tokens vary is reported as a suspected inversion.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .._io import read_jsonl


@dataclass(frozen=True)
class Violation:
    """One violated rule at (row, position); position is None for whole-row findings."""

    row: int
    position: int | None
    rule: str
    message: str

    def __str__(self) -> str:
        where = f"row {self.row}" + ("" if self.position is None else f", position {self.position}")
        return f"[{self.rule}] {where}: {self.message}"


def _as_rows(x, name: str) -> list[list]:
    if hasattr(x, "tolist"):
        x = x.tolist()
    if not isinstance(x, (list, tuple)):
        raise ValueError(f"{name} must be a list of rows (or a 2-D tensor), got {type(x).__name__}")
    if x and not isinstance(x[0], (list, tuple)):
        x = [x]  # a single row
    return [list(r) for r in x]


def _side(mask: list[int]) -> tuple[str | None, int | None]:
    """('left' | 'right' | None (no padding) | 'hole', where the hole starts) for a 0/1 row."""
    if all(mask) or not any(mask):
        return None, None
    first, last = mask.index(1), len(mask) - 1 - mask[::-1].index(1)
    # the first zero between real tokens; padded on both ends instead: where the trailing padding starts
    both_ends = first > 0 and last < len(mask) - 1
    hole = next((t for t in range(first, last) if mask[t] == 0), last + 1 if both_ends else None)
    return ("hole", hole) if hole is not None else ("left" if first > 0 else "right", None)


def check_masks(input_ids, attention_mask, position_ids=None, pad_token_id: int | None = None) -> list[Violation]:
    """All rule violations of a batch (empty list = valid). Accepts lists of rows or 2-D tensors."""
    ids = _as_rows(input_ids, "input_ids")
    masks = _as_rows(attention_mask, "attention_mask")
    pos = None if position_ids is None else _as_rows(position_ids, "position_ids")
    n = len(ids)  # row counts that differ between the tensors, and rows whose length differs from most rows
    findings = [
        Violation(min(n, len(rows)), None, "length_mismatch", f"input_ids has {n} rows but {name} has {len(rows)}")
        for name, rows in (("attention_mask", masks), ("position_ids", pos))
        if rows is not None and len(rows) != n
    ]
    if len(lengths := {len(r) for r in ids}) > 1:
        common = max(lengths, key=lambda n: sum(len(r) == n for r in ids))
        findings += [
            Violation(i, None, "ragged_batch", f"row has {len(r)} tokens, most rows have {common}")
            for i, r in enumerate(ids)
            if len(r) != common
        ]
    sides: dict[int, str] = {}
    for i, (row_ids, row_mask) in enumerate(zip(ids, masks, strict=False)):  # the rows both have, whatever the counts
        row_pos = pos[i] if pos is not None and i < len(pos) else None
        row, side = _row_findings(i, row_ids, row_mask, row_pos, pad_token_id)
        findings += row
        if side is not None:
            sides[i] = side
    if len(set(sides.values())) <= 1:
        return findings
    majority = max(("left", "right"), key=lambda s: sum(v == s for v in sides.values()))  # rows on the minority side
    return findings + [
        Violation(i, None, "mixed_padding_side", f"row is {s}-padded while the other padded rows are {majority}-padded")
        for i, s in sides.items()
        if s != majority
    ]


def _row_findings(
    i: int, row_ids: list, row_mask: list, row_pos: list | None, pad: int | None
) -> tuple[list[Violation], str | None]:
    """Findings of row ``i`` and its padding side ('left'/'right'; None when unpadded or unusable)."""
    if len(row_mask) != len(row_ids):
        return [_length_mismatch(i, "attention_mask", len(row_mask), len(row_ids))], None
    if bad := [(t, v) for t, v in enumerate(row_mask) if not (isinstance(v, (bool, int, float)) and v in (0, 1))]:
        msg = f"attention_mask value {bad[0][1]!r} is not 0/1 ({len(bad)} such value(s) in the row)"
        return [Violation(i, bad[0][0], "non_binary", msg)], None
    m = [int(v) for v in row_mask]
    if not any(m):
        return [Violation(i, None, "empty_row", "attention_mask is all zeros: no query has a visible key")], None
    if _inverted(row_ids, m, pad):
        msg = "mask is 1 on the padding and 0 on the content — inverted (e.g. built as input_ids == pad, not != pad)"
        return [Violation(i, m.index(1), "inverted_mask", msg)], None
    findings: list[Violation] = []
    if leaks := [t for t, (tok, v) in enumerate(zip(row_ids, m, strict=True)) if pad is not None and tok == pad and v]:
        msg = f"pad token {pad} has mask 1 at {len(leaks)} position(s) {leaks[:8]} — padding would be attended to"
        findings.append(Violation(i, leaks[0], "pad_unmasked", msg))
    side, hole = _side(m)
    if side == "hole":
        findings.append(Violation(i, hole, "mask_hole", "mask has zeros between real tokens (or padding on both ends)"))
    if row_pos is not None:
        findings += _check_positions(i, row_pos, m, side)
    return findings, (side if side != "hole" else None)


def _length_mismatch(i: int, name: str, n: int, expected: int) -> Violation:
    return Violation(i, min(n, expected), "length_mismatch", f"{name} has {n} entries, input_ids {expected}")


def _inverted(row_ids: Sequence[int], m: list[int], pad: int | None) -> bool:
    on = [t for t, v in zip(row_ids, m, strict=True) if v == 1]
    off = [t for t, v in zip(row_ids, m, strict=True) if v == 0]
    if not off:
        return False
    if pad is not None:
        return all(t == pad for t in on) and not any(t == pad for t in off)
    # Heuristic without a pad id: the "real" tokens are one id repeated, the masked ones vary.
    return len(on) >= 2 and len(set(on)) == 1 and len(set(off)) >= 2


def _check_positions(i: int, p: list, m: list[int], side: str | None) -> list[Violation]:
    if len(p) != len(m):
        return [_length_mismatch(i, "position_ids", len(p), len(m))]
    real = [t for t, v in enumerate(m) if v == 1]
    k, t = next(((k, t) for k, t in enumerate(real) if p[t] != k), (None, None))
    if t is None:
        return []
    if side == "left" and k == 0:
        msg = (
            f"first real token after left padding has position {p[t]}, expected 0 — positions count padding "
            "(use attention_mask.cumsum(-1) - 1)"
        )
        return [Violation(i, t, "positions_not_restarting", msg)]
    return [Violation(i, t, "positions", f"real token #{k} has position {p[t]}, expected {k}")]


def load_batch_jsonl(path: str | Path) -> dict:
    """A batch file — JSONL, one object per row ``{"input_ids": [...], "attention_mask": [...], "position_ids":
    [...]?}``, or one JSON object whose values are lists of rows — as ``{"input_ids": rows, "attention_mask": rows,
    "position_ids": rows | None, "pad_token_id": int | None}``."""
    try:  # one JSON object, perhaps pretty-printed over several lines
        objs = [json.loads(Path(path).read_text(encoding="utf-8"))]
    except json.JSONDecodeError:
        objs = [o for _, o in read_jsonl(path)]
    if not objs:
        raise ValueError(f"{path}: no rows")
    for n, o in enumerate(objs, 1):
        if not isinstance(o, dict) or "input_ids" not in o or "attention_mask" not in o:
            raise ValueError(f"{path}: object {n} needs keys 'input_ids' and 'attention_mask'")
    pad = next((o["pad_token_id"] for o in objs if "pad_token_id" in o), None)
    if len(objs) == 1 and objs[0]["input_ids"] and isinstance(objs[0]["input_ids"][0], list):
        return {k: objs[0].get(k) for k in ("input_ids", "attention_mask", "position_ids")} | {"pad_token_id": pad}
    has_pos = [("position_ids" in o) for o in objs]
    if any(has_pos) and not all(has_pos):
        raise ValueError(f"{path}: position_ids given for some rows but not all")
    rows = {k: [o[k] for o in objs] for k in ("input_ids", "attention_mask")}
    return rows | {"position_ids": [o["position_ids"] for o in objs] if all(has_pos) else None, "pad_token_id": pad}
