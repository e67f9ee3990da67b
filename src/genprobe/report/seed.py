"""The figures published in the chapter, transcribed in ``seed_tables.json`` and keyed like ``ch3_case.json`` (the
report prints them beside ours)."""

from __future__ import annotations

import json
from importlib import resources


def seed_tables() -> dict:
    """The transcribed seed figures (a fresh copy each call: safe to mutate)."""
    return json.loads((resources.files("genprobe.report") / "seed_tables.json").read_text(encoding="utf-8"))
