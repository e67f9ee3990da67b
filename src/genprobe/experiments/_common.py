"""What the experiments share: the case prompt, rounding."""

from __future__ import annotations

import math
from dataclasses import fields
from typing import ClassVar

from .._io import json_safe

CASE_PROMPT = "春江潮水连海平"  # its unknown characters are reported (encode_with_report), not warned: expected


def r(x: float | None, nd: int = 4) -> float | None:
    """Round for JSON (None and non-finite values pass as None)."""
    if x is None or not math.isfinite(x):
        return None
    return round(float(x), nd)


def rounded(x: object, nd: int = 4) -> object:
    """:func:`r` of a float, or of each float of a list; anything else as :func:`json_safe` writes it."""
    if isinstance(x, float):
        return r(x, nd)
    if isinstance(x, (list, tuple)):
        return [rounded(v, nd) for v in x]
    return json_safe(x)


class Rounded:
    """A dataclass of measurements whose JSON form is its fields in order (or the names ``JSON_KEYS`` lists, spaced,
    properties included), each float rounded to 4 decimals (``DIGITS_OF[name]`` where given)."""

    DIGITS_OF: ClassVar[dict[str, int]] = {}
    JSON_KEYS: ClassVar[str] = ""

    def to_dict(self) -> dict:
        """JSON form (rounded)."""
        keys = self.JSON_KEYS.split() or [f.name for f in fields(self)]  # type: ignore[arg-type]  # subclasses are dataclasses
        return {k: rounded(getattr(self, k), self.DIGITS_OF.get(k, 4)) for k in keys}
