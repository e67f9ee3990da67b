"""``genprobe loops scan|locate|repair|apply|revert|compare MODEL``: the ``loops`` parser; each action lives in
:mod:`genprobe.cli.loops`, the flags and checks they share in ``genprobe.cli.loops._shared``.
"""

from __future__ import annotations

import argparse

from .loops.compare import register_compare
from .loops.patch import register_patch_action
from .loops.repair import register_locate, register_repair
from .loops.scan import register_scan


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``loops`` and its sub-commands."""
    p = sub.add_parser(
        "loops",
        help="measure greedy loops over prompt sets and repair them with a small directional weight edit",
        description="Loop observatory and directional repair. Default decoding is the 'chanting' setting: greedy "
        "with <unk> banned; a model with an end-of-text token generates a fixed number of tokens with it banned.",
    )
    lsub = p.add_subparsers(dest="loops_command", metavar="ACTION")
    register_scan(lsub)
    register_locate(lsub)
    register_repair(lsub)
    register_patch_action(lsub, "apply", "apply a patch to a model directory (refused if its weights hash differs)")
    register_patch_action(lsub, "revert", "restore the exact original weights of a patched model directory")
    register_compare(lsub)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
