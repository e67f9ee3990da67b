"""The prompts a doctor run uses: the user's, or held-out prompts of the model's language (Tang openings held out
from both reference models for a Chinese tokenizer, English sentence openings of the Lee corpus otherwise —
:func:`genprobe.corpus.inputs.held_out`), and held-out text for the weight edit's limits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..corpus.inputs import held_out
from .options import DoctorOptions

EDIT_PROMPTS = 128  # prompts the weight edit searches on, disjoint from the scanned ones when built in
EDIT_MIN = 64  # your prompts beyond the comparison's that let the edit search on others (else on all of them)


@dataclass
class DoctorInputs:
    """Prompts to scan, prompts for the edit, held-out text, where they came from (None: no tokenizer)."""

    prompts: list[str] | None
    edit_prompts: list[str]
    val_text: str | None
    source: str
    error: str | None = None


def check_fits(model: Any, prompts: list[str], tokens: int, chat: bool) -> None:
    """Refuse (ValueError: bad input) prompts that leave no room for the ``tokens`` a scan generates."""
    import warnings

    if model.max_positions is None or model.tokenizer is None:
        return
    with warnings.catch_warnings():  # unknown characters are the model card's finding
        warnings.simplefilter("ignore")
        longest = max(len(model.encode(model.chat_prompt(p) if chat else p)) for p in prompts)
    if longest + tokens > model.max_positions:
        raise ValueError(
            f"prompts: the longest has {longest} tokens, and with the {tokens} new tokens a scan generates it exceeds "
            f"the model's context length {model.max_positions}; give prompts of at most "
            f"{max(0, model.max_positions - tokens)} tokens"
        )


def doctor_inputs(model: Any, opts: DoctorOptions) -> DoctorInputs:
    """The user's prompts, else the built-in held-out ones (the reason when there are none)."""
    b = opts.plan
    if model.tokenizer is None:
        return DoctorInputs(None, [], None, "none", "the model has no tokenizer")
    extra = EDIT_PROMPTS if opts.with_edit else 0
    try:
        d = held_out(model, count=b.scan_prompts + extra) if opts.prompts is None or extra else None
    except (ValueError, FileNotFoundError) as exc:
        if opts.prompts is None:
            return DoctorInputs(None, [], None, "none", f"{type(exc).__name__}: {exc}")
        d = None
    val = "\n".join(d.texts) if d is not None else None
    if opts.prompts is not None:
        user = list(opts.prompts)
        if {"degeneration", "fixes"} & set(opts.only):  # the stages that generate after the prompts
            check_fits(model, user, b.scan_tokens, opts.chat)
        rest = user[b.fix_prompts :]  # the edit searches on the prompts the comparison does not use, when enough
        return DoctorInputs(user, rest if len(rest) >= EDIT_MIN else user, val, "prompts (user)")
    assert d is not None
    source = str(d.sources.get("corpus", "held-out"))
    scan = d.prompts[: b.scan_prompts]
    return DoctorInputs(scan, d.prompts[b.scan_prompts :] or scan, val, f"{source} held-out prompts")
