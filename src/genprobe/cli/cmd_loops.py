"""Measure greedy loops over prompt sets and repair them with a small directional weight edit.

Loop observatory and directional repair. Default decoding is the 'chanting' setting: greedy with <unk> banned; a
model with an end-of-text token generates a fixed number of tokens with it banned.
"""

from __future__ import annotations

from ._common import Command
from .loops.compare import COMPARE
from .loops.repair import APPLY, LOCATE, REPAIR, REVERT
from .loops.scan import SCAN

COMMANDS = (Command("loops", __doc__, actions=(SCAN, LOCATE, REPAIR, APPLY, REVERT, COMPARE)),)
