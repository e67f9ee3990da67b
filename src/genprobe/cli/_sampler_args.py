"""Every sampler flag in one place: ``add_sampler_arguments`` and ``sampler_from_args``.

Flags default to "not given" so that ``--preset`` (an engine's defaults) is only overridden by what the user typed.
Names follow transformers (``--top-k``, ``--penalty-alpha``) and llama.cpp for its samplers (``--dry-*``, ``--xtc-*``).
"""

from __future__ import annotations

import argparse
from typing import Any

from ..engine.samplers.llama_cpp import DEFAULT_BREAKERS, tokenizer_breakers
from ..engine.samplers.stages import DRY, ENGINES, ORDERS, PARAMS, PRESETS, SamplerConfig
from ._common import Accumulate


def add_sampler_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the sampler flags: each stage's parameters (:mod:`genprobe.engine.samplers.stages`), plus the modes."""
    g = parser.add_argument_group("sampling (default: plain τ=1 sampling; every value is validated)")
    h = "an engine's defaults, order and arithmetic (llama.cpp: τ 0.8, top-k 40, top-p 0.95, min-p 0.05; hf: top-k 50)"
    g.add_argument("--preset", choices=sorted(PRESETS), help=h + "; other flags override")
    g.add_argument("--greedy", action="store_true", help="argmax decoding (bans, penalties and DRY still apply)")
    for p in PARAMS:
        g.add_argument(p.flag, type=int if p.integer else float, help=f"{p.help} ({p.note})")
    breakers = "strings that cut DRY matches (escapes like \\n work; 'none' = no breakers; default: llama.cpp's "
    g.add_argument("--dry-sequence-breakers", nargs="+", action=Accumulate, metavar="S", help=breakers + '\\n : " *)')
    order = "where temperature sits relative to truncation (default trunc_then_temp, or the preset's)"
    g.add_argument("--order", choices=sorted(ORDERS), help=order)
    g.add_argument("--engine", choices=list(ENGINES), help="whose arithmetic each stage uses (default: the order's)")
    g.add_argument("--ban-unk", action="store_true", help="never generate <unk>")


# flag dest → SamplerConfig field, for the plain valued flags
_FIELDS = (*(p.name for p in PARAMS), "order", "engine")
# every sampler flag's dest: the valued fields plus the switches and the non-numeric options
SAMPLER_DESTS = ("preset", "greedy", *_FIELDS, "dry_sequence_breakers", "ban_unk")


def sampler_flags_given(args: argparse.Namespace, values: bool = False) -> list[str]:
    """The sampler flags set on this command line, spelled as typed (``--top-p``), in a fixed order; with ``values``
    each followed by its values (``--top-p 0.9``: what reproduces the sampler)."""
    out: list[str] = []
    for dest in SAMPLER_DESTS:
        value = getattr(args, dest, None)
        if value in (None, False):
            continue
        out.append("--" + dest.replace("_", "-"))
        if values and value is not True:
            out += map(str, value) if isinstance(value, list) else [str(value)]
    return out


def unescape(s: str) -> str:
    """Python's backslash escapes in a breaker string typed on a command line (``\\n`` → newline)."""
    return s.encode("latin-1", "backslashreplace").decode("unicode_escape")  # non-Latin-1 text passes as \uXXXX


def sampler_from_args(args: argparse.Namespace, tokenizer: Any = None) -> SamplerConfig:
    """The validated :class:`SamplerConfig` the flags describe (``tokenizer`` for <unk> and DRY breakers)."""
    given = {f: getattr(args, f) for f in _FIELDS if getattr(args, f, None) is not None}
    if getattr(args, "greedy", False):
        given["greedy"] = True
    if getattr(args, "ban_unk", False):
        unk = getattr(tokenizer, "unk_id", None)
        if unk is None:
            raise ValueError("--ban-unk: this tokenizer has no unknown token")
        given["ban_ids"] = (int(unk),)
    cfg = SamplerConfig.preset(args.preset, **given) if getattr(args, "preset", None) else SamplerConfig(**given)
    if DRY.active(cfg):
        strings = getattr(args, "dry_sequence_breakers", None)
        if tokenizer is None and strings != ["none"]:
            raise ValueError(
                "--dry-sequence-breakers are strings and need the model's tokenizer; this model has none "
                "(pass --dry-sequence-breakers none)"
            )
        breakers = [unescape(s) for s in strings] if strings else DEFAULT_BREAKERS
        cfg = cfg.replace(dry_sequence_breakers=() if strings == ["none"] else tokenizer_breakers(tokenizer, breakers))
    return cfg
