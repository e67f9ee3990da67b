"""Every sampler flag in one place: ``add_sampler_arguments`` and ``sampler_from_args``.

Flags default to "not given" so that ``--preset`` (an engine's defaults) is only overridden by
what the user typed. Names follow transformers (``--top-k``, ``--penalty-alpha``,
``--repetition-penalty``) and llama.cpp for its samplers (``--dry-*``, ``--xtc-*``).
"""

from __future__ import annotations

import argparse
from typing import Any

from ..engine.samplers.config import ENGINES, ORDERS, PRESETS, SamplerConfig
from ..engine.samplers.dry import DEFAULT_BREAKERS, tokenizer_breakers
from ._common import Accumulate

# flag dest → SamplerConfig field, for the plain valued flags
_FIELDS = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "typical_p",
    "top_n_sigma",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "penalty_last_n",
    "no_repeat_ngram",
    "dry_multiplier",
    "dry_base",
    "dry_allowed_length",
    "dry_last_n",
    "xtc_probability",
    "xtc_threshold",
    "penalty_alpha",
    "order",
    "engine",
)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'"}


def add_sampler_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the sampler flags (greedy, truncations, penalties, DRY, XTC, contrastive search, order/engine)."""
    g = parser.add_argument_group("sampling (default: plain τ=1 sampling; every value is validated)")
    g.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="an engine's defaults, order and arithmetic "
        "(llama.cpp: τ 0.8, top-k 40, top-p 0.95, min-p 0.05; hf: top-k 50); other flags override",
    )
    g.add_argument("--greedy", action="store_true", help="argmax decoding (bans, penalties and DRY still apply)")
    g.add_argument("--temperature", type=float, help="divide logits by T > 0 (default 1)")
    g.add_argument(
        "--top-k", type=int, help="keep the K most likely tokens (0 = off); with --penalty-alpha: candidates"
    )
    g.add_argument("--top-p", type=float, help="nucleus: smallest set whose mass reaches P (1 = off)")
    g.add_argument("--min-p", type=float, help="keep tokens with p >= M * p_max (0 = off)")
    g.add_argument("--typical-p", type=float, help="locally typical sampling mass (1 = off; HF semantics)")
    g.add_argument("--top-n-sigma", type=float, help="keep logits >= max - N*sigma (0 = off; llama.cpp semantics)")
    g.add_argument("--repetition-penalty", type=float, help="CTRL penalty on seen tokens (1 = off)")
    g.add_argument("--presence-penalty", type=float, help="subtract P once per generated token id (OpenAI/vLLM)")
    g.add_argument("--frequency-penalty", type=float, help="subtract F per occurrence in the output (OpenAI/vLLM)")
    g.add_argument(
        "--penalty-last-n", type=int, help="penalties count only the last N tokens (-1 = all; llama.cpp default 64)"
    )
    g.add_argument("--no-repeat-ngram", type=int, help="ban tokens completing a repeated N-gram (HF)")
    g.add_argument("--dry-multiplier", type=float, help="DRY strength (0 = off; llama.cpp)")
    g.add_argument("--dry-base", type=float, help="DRY base (default 1.75)")
    g.add_argument("--dry-allowed-length", type=int, help="repeats up to this length are free (default 2)")
    g.add_argument("--dry-last-n", type=int, help="tokens DRY scans (-1 = the whole context, default)")
    g.add_argument(
        "--dry-sequence-breakers",
        nargs="+",
        action=Accumulate,
        metavar="S",
        help="strings that cut DRY matches (escapes like \\n work; 'none' = no breakers; "
        "default: llama.cpp's \\n : \" *)",
    )
    g.add_argument("--xtc-probability", type=float, help="XTC: chance per step to exclude top choices (0 = off)")
    g.add_argument("--xtc-threshold", type=float, help="XTC: probability that makes a top choice (default 0.1)")
    g.add_argument("--penalty-alpha", type=float, help="contrastive search degeneration penalty (with --top-k)")
    g.add_argument(
        "--order",
        choices=sorted(ORDERS),
        help="where temperature sits relative to truncation (default trunc_then_temp, or the preset's)",
    )
    g.add_argument("--engine", choices=list(ENGINES), help="whose arithmetic each stage uses (default: the order's)")
    g.add_argument("--ban-unk", action="store_true", help="never generate <unk>")


# every sampler flag's dest: the valued fields plus the switches and the non-numeric options
SAMPLER_DESTS = ("preset", "greedy", *_FIELDS, "dry_sequence_breakers", "ban_unk")


def sampler_flags_given(args: argparse.Namespace) -> list[str]:
    """The sampler flags set on this command line, spelled as typed (``--top-p``), in a fixed order."""
    return ["--" + d.replace("_", "-") for d in SAMPLER_DESTS if getattr(args, d, None) not in (None, False)]


def unescape(s: str) -> str:
    """Backslash escapes of a breaker string typed on a command line (``\\n`` → newline)."""
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 1 < len(s) and s[i + 1] in _ESCAPES:
            out.append(_ESCAPES[s[i + 1]])
            i += 2
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def _breakers(strings: list[str] | None, tokenizer: Any) -> tuple[tuple[int, ...], ...]:
    if strings == ["none"]:
        return ()
    if tokenizer is None:
        raise ValueError(
            "--dry-sequence-breakers are strings and need the model's tokenizer; this model has none "
            "(pass --dry-sequence-breakers none)"
        )
    return tokenizer_breakers(tokenizer, [unescape(s) for s in strings] if strings else DEFAULT_BREAKERS)


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
    if cfg.dry_active:
        cfg = cfg.replace(dry_sequence_breakers=_breakers(getattr(args, "dry_sequence_breakers", None), tokenizer))
    return cfg
