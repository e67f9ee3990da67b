"""genprobe's one serialiser (#45): every result's JSON form is written from its fields, strict and complete."""

from __future__ import annotations

import enum
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

import genprobe
from genprobe._io import NOT_JSON


class Colour(enum.Enum):
    RED = "red"


@dataclass
class Inner:
    value: float
    ids: tuple[int, ...] = (1, 2)

    def to_dict(self) -> dict:  # a custom shape wins over the fields
        return {"v": self.value}


@dataclass
class Outer:
    JSON_PROPERTIES = ("doubled",)

    x: float
    inner: Inner
    by_length: dict[int, float]
    rows: list[Inner]
    tensor: torch.Tensor
    path: Path
    colour: Colour
    hidden: list = field(default_factory=list, metadata=NOT_JSON)
    _cache: dict = field(default_factory=dict)

    @property
    def doubled(self) -> float:
        return 2 * self.x


def test_the_json_form_is_the_fields_recursively_strict_and_with_the_declared_extras():
    o = Outer(
        math.inf, Inner(math.nan), {8: -math.inf}, [Inner(1.0)], torch.tensor([1, 2]), Path("a/b"), Colour.RED, [1]
    )
    d = genprobe.json_safe(o)
    assert d == {
        "x": "inf",
        "inner": {"v": "nan"},
        "by_length": {"8": "-inf"},
        "rows": [{"v": 1.0}],
        "tensor": [1, 2],
        "path": "a/b",
        "colour": "red",
        "doubled": "inf",
    }
    json.dumps(d, allow_nan=False)  # strict JSON: no NaN/Infinity tokens


def test_tuples_and_sets_become_lists():
    assert genprobe.json_safe({"t": (1, (2, 3)), "s": {4}}) == {"t": [1, [2, 3]], "s": [4]}
