"""Measure greedy loops over prompt sets and repair them with a small directional weight edit.

Loop observatory and directional repair. Default decoding is the 'chanting' setting: greedy with <unk> banned; a
model with an end-of-text token generates a fixed number of tokens with it banned.
"""

from __future__ import annotations

import argparse

from ._common import Command
from .loops.compare import COMPARE
from .loops.repair import APPLY, LOCATE, REPAIR, REVERT
from .loops.scan import SCAN


def choose_action(args: argparse.Namespace) -> int:
    """``genprobe loops`` without an action: says which there are."""
    raise ValueError("choose an action: scan, locate, repair, apply, revert or compare (genprobe loops -h)")


COMMANDS = (Command("loops", __doc__, choose_action, actions=(SCAN, LOCATE, REPAIR, APPLY, REVERT, COMPARE)),)
