"""Flags, checks and loading shared by the ``genprobe loops`` actions. ``--tang-prompts`` / ``--tang-val`` are the
defaults for the bundled character model only and explicit choices for every other model.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

from .._common import (
    MODEL_HELP,
    add_max_new_tokens,
    add_prompt_arguments,
    check_min,
    fields_of,
    info,
    option,
    read_prompts,
)
from .._vllm_args import add_kv_type

DEFAULT_MODEL = Path("out/case/model")  # what `bash scripts/case.sh` trains
#: MODEL of every loops action: optional (default :data:`DEFAULT_MODEL`)
LOOPS_MODEL: dict[str, Any] = {"optional_model": True, "model_help": f"{MODEL_HELP} (default {DEFAULT_MODEL})"}


# ---- shared flags ---------------------------------------------------------------------------
LOOP_FLAGS = (  # (flag, LoopSettings field, help): the detectors' settings every loops action takes
    ("--min-tail", "min_tail", "exact loop: minimal periodic tail in tokens"),
    ("--near-window", "window", "near loop and compression: tail length in tokens"),
    ("--near-max-period", "max_period", "near loop: longest period tried"),
    ("--near-min-match", "min_match", "near loop: share of tail tokens that must repeat"),
    ("--min-compression", "min_compression", "repetitive tail: tail tokens per LZ piece"),
)


def add_loop_args(q: argparse.ArgumentParser, with_val: bool, chat: bool = True) -> None:
    """The flags every loops action takes (after MODEL: :data:`LOOPS_MODEL`): generation, the detectors and their
    calibration on human text (scan, locate and repair judge "degenerate" the same way), the prompts; ``with_val``:
    the validation text of the regression check."""
    from ...loops.study import RepairConfig

    d = RepairConfig()
    add_max_new_tokens(q, d.max_new_tokens)
    add_config_flag(q, "batch_size", "prompts per generation batch")
    add_config_flag(q, "seed", "sampling seed")
    for flag, name, help in LOOP_FLAGS:
        option(q, flag, getattr(d.loop, name), help, dest=name)
    option(q, "--threads", 1, "torch CPU threads (1: a small model's decode steps are dominated by thread sync)")
    option(q, "--no-progress", False, "no progress bars")
    c = q.add_mutually_exclusive_group()
    human = "calibrate the detectors on this human text (UTF-8, one document per line; default: held-out Tang poems "
    human += "for Chinese prompts, else `genprobe fetch english`)"
    option(c, "--human-text", type=Path, metavar="FILE", help=human)
    option(c, "--no-calibrate", False, "use the detector flags as given instead of thresholds calibrated on human text")
    option(q, "--human-fpr", 0.01, "calibration target: largest share of human text flagged degenerate", metavar="RATE")
    add_prompt_arguments(q, help_default=" (default for the bundled char model: held-out Tang openings)")
    if chat:
        option(q, "--chat", False, "give each prompt to the model as a user turn rendered by its chat template")
    option(q, "--tang-prompts", False, "openings of held-out Tang poems (the default for the bundled char model)")
    option(q, "--prefix", 5, "characters per Tang opening")
    if with_val:
        g = q.add_mutually_exclusive_group()
        option(g, "--val-text", type=Path, metavar="FILE", help="UTF-8 text for the regression check (KL, Δloss)")
        option(g, "--tang-val", False, "the bundled corpus's validation split (the default for the bundled model)")
        option(q, "--val-window", type=int, metavar="N", help="tokens per regression window (default: context, ≤ 64)")


def add_config_flag(p: argparse.ArgumentParser, name: str, help: str = "", flag: str | None = None, **kw: Any) -> None:
    """``--name`` (or ``flag``) for the :class:`~genprobe.loops.study.RepairConfig` field ``name``: its type and
    default come from the field (a tuple field takes one or more values), its choices from the ones named here."""
    from ...loops.study import SEARCHES, RepairConfig

    choices = {"method": ("mean_diff", "pca"), "forms": ("subtract", "project"), "search": SEARCHES}
    kw = {"choices": choices[name]} | kw if name in choices else kw
    option(p, flag or "--" + name.replace("_", "-"), getattr(RepairConfig(), name), help, dest=name, **kw)


# ---- common checks and loading --------------------------------------------------------------
def check_common(args: argparse.Namespace) -> None:
    import torch

    check_min(args, threads=1, max_new_tokens=16, batch_size=1)  # fewer than 16 new tokens cannot show a loop
    torch.set_num_threads(args.threads)


def add_llamacpp_args(p: argparse.ArgumentParser) -> None:
    """The llama.cpp backend's flags (``--threads`` is shared: llama.cpp's threads too)."""
    g = p.add_argument_group("llama.cpp (with --backend llama.cpp; MODEL is the GGUF file)")
    add_kv_type(g, "f16")
    option(g, "--dry-breakers", [], "DRY's sequence breakers as strings for llama.cpp to tokenize", metavar="TEXT")


def load_model_or_default(args: argparse.Namespace) -> Any:
    from ...model.load import load_model

    return load_model(args.model or str(DEFAULT_MODEL))


def is_bundled_char_model(model: Any) -> bool:
    return model.tokenizer is not None and model.tokenizer.kind == "char"


def read_loop_prompts(args: argparse.Namespace, model: Any) -> tuple[list[str] | None, str]:
    """The user's prompts (None = Tang openings) and a description of where they came from."""
    given = read_prompts(args)
    if given is not None and args.tang_prompts:
        raise ValueError("choose one prompt source: --prompt/--prompts or --tang-prompts")
    if given is not None:
        return given, f"file:{args.prompts}" if getattr(args, "prompts", None) else "command line"
    if not args.tang_prompts and not is_bundled_char_model(model):
        raise ValueError(
            "this model is not the bundled character model, so there is no default prompt set: give --prompts FILE "
            "(one per line, or JSONL with a 'prompt'/'text' field) or --prompt TEXT ..., or choose --tang-prompts "
            "(openings of Tang poems outside the default corpus) explicitly"
        )
    return None, "tang-heldout-openings"


def loop_settings_from(args: argparse.Namespace) -> Any:
    from ...metrics.degeneracy import LoopSettings

    return fields_of(LoopSettings, args)


def repair_inputs(args: argparse.Namespace, model: Any, cfg: Any, sets: tuple[str, ...]) -> Any:
    from ..._io import read_text
    from ...corpus.inputs import read_prompt_file
    from ...corpus.tang import load_corpus
    from ...loops.study import RepairInputs

    prompts, source = read_loop_prompts(args, model)
    if args.val_text is not None:
        val, val_source = read_text(args.val_text, "--val-text file"), f"file:{args.val_text}"
    elif not args.tang_val and not is_bundled_char_model(model):
        raise ValueError(
            "this model is not the bundled character model, so there is no default validation text: give "
            "--val-text FILE (held-out text in the model's domain) or choose --tang-val explicitly"
        )
    else:
        val, val_source = load_corpus().val, "tang-validation-split"
    validate = getattr(args, "validate_prompts", None)
    if prompts is None:
        if validate:
            raise ValueError("--validate-prompts needs --prompts/--prompt for the direction and search sets")
        return replace(RepairInputs.tang(model.tokenizer, cfg, sets), val_text=val, val_source=val_source)
    if len(sets) == 1:  # locate: every prompt goes to the direction set
        inputs = RepairInputs(list(dict.fromkeys(prompts)), [], [], val, source, val_source)
    else:
        held = read_prompt_file(validate) if validate else None
        source += f"; held-out validation: file:{validate}" if validate else ""
        inputs = RepairInputs.from_prompts(prompts, val, cfg, source, val_source, validate=held)
    return replace(inputs, chat=chat_flag(args, model))


def chat_flag(args: argparse.Namespace, model: Any) -> bool:
    """--chat, refused with the reason when the model has no chat template."""
    if getattr(args, "chat", False) and model.chat_template is None:
        raise ValueError(f"--chat: the model {model.source or ''} has no chat template")
    return bool(getattr(args, "chat", False))


def scan_calibration(args: argparse.Namespace, model: Any, texts: list[str]) -> Any:
    """The detector calibration of this scan (None with --no-calibrate); says which human text it used."""
    from ...loops.scan import calibrate_for_scan

    if args.no_calibrate:
        info("detectors: raw settings (--no-calibrate): no human false-positive rate is measured")
        return None
    if not 0.0 <= args.human_fpr < 1.0:
        raise ValueError(f"--human-fpr must be in [0, 1), got {args.human_fpr}")
    cal = calibrate_for_scan(
        model.tokenizer,
        args.max_new_tokens,
        texts,
        human_text=args.human_text,
        base=loop_settings_from(args),
        target=args.human_fpr,
        unk_id=model.unk_id,
    )
    info(f"detectors: {cal.describe()}")
    return cal
