"""Helpers shared by the sub-command modules."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_json_flag(p: argparse.ArgumentParser) -> None:
    """Every genprobe command accepts ``--json`` (machine-readable summary on stdout)."""
    p.add_argument("--json", action="store_true", help="print a machine-readable JSON summary on stdout")


def emit_json(obj: Any) -> None:
    """Print ``obj`` as JSON on stdout (UTF-8, characters kept readable)."""
    sys.stdout.write(json.dumps(obj, ensure_ascii=False, indent=2, default=_default) + "\n")
    sys.stdout.flush()


def _default(o: Any) -> Any:
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if hasattr(o, "__dataclass_fields__"):
        from dataclasses import asdict

        return asdict(o)
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def info(msg: str, quiet: bool = False) -> None:
    """Human-readable progress goes to stderr so ``--json`` stdout stays clean."""
    if not quiet:
        print(msg, file=sys.stderr, flush=True)
