"""The figures published in the chapter 《训练与推理的两副面孔》 ("The two faces of training and inference"),
transcribed in ``seed_tables.json`` and keyed like ``ch3_case.json`` (the report prints them beside ours).

Part of the report, which shows them."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources


@lru_cache(maxsize=1)
def _load() -> str:
    return (resources.files("genprobe.report") / "seed_tables.json").read_text(encoding="utf-8")


def seed_tables() -> dict:
    """A fresh copy of the transcribed seed figures (safe to mutate)."""
    return json.loads(_load())
