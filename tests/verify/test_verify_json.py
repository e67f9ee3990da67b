"""Strict JSON: NaN and infinities never reach ``--json`` output as the non-standard ``NaN``/``Infinity``."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import pytest
import torch

from genprobe._io import json_safe
from genprobe.cli._common import emit_json


def refuse(name):
    raise ValueError(f"non-standard JSON constant {name}")


@dataclass
class Result:
    x: float
    ys: list

    def to_dict(self):
        return {"x": self.x, "ys": self.ys}


def test_json_safe_spells_out_non_finite_numbers():
    obj = {
        "a": math.nan,
        "b": [math.inf, -math.inf, 1.5, None, True, 3],
        "c": (2.0, "inf"),
        "d": Result(math.nan, [torch.tensor([1.0, math.inf])]),
        "e": torch.tensor(math.nan),
    }
    safe = json_safe(obj)
    assert safe == {
        "a": "nan",
        "b": ["inf", "-inf", 1.5, None, True, 3],
        "c": [2.0, "inf"],
        "d": {"x": "nan", "ys": [[1.0, "inf"]]},
        "e": "nan",
    }
    json.loads(json.dumps(safe, allow_nan=False), parse_constant=refuse)


def test_emit_json_is_strict(capsys):
    emit_json({"max_abs_dlogit": math.inf, "rel": [math.nan]})
    d = json.loads(capsys.readouterr().out, parse_constant=refuse)
    assert d == {"max_abs_dlogit": "inf", "rel": ["nan"]}


def test_plain_json_dumps_would_not_be(capsys):
    """Why json_safe exists: Python's default writes tokens that strict parsers reject."""
    with pytest.raises(ValueError, match="non-standard"):
        json.loads(json.dumps({"x": math.nan}), parse_constant=refuse)
