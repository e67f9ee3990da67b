"""The model card: architecture, size, weights' dtype (and a GGUF file's quantization) per tensor type, context
length, generation defaults; and the tokenizer's facts: a lossless round trip on the prompts, the unknown /
byte-fallback share, end-of-text and padding tokens present and distinct, the chat template present and rendering —
and what each one means."""

from __future__ import annotations

import re
import shlex
import warnings
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..model.load import Model
from .options import DoctorRun, Finding

_LAYER_INDEX = re.compile(r"\.\d+\.")  # h.3.mlp / model.layers.3.mlp / GGUF's blk.3.ffn_down: the layer as *
GGUF_SUMMARY = ("path", "architecture", "name", "context_length", "type_counts", "sha256")
GENERATION_KEYS = tuple(
    "do_sample temperature top_k top_p min_p repetition_penalty no_repeat_ngram_size max_new_tokens max_length "
    "bos_token_id eos_token_id pad_token_id".split()
)


# ---- the tokenizer's facts ------------------------------------------------------------------------------------------
_BYTE_TOKEN = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")
UNK_WARN = 0.01  # a larger share of unknown tokens in the prompts is a warning
EXAMPLES = 3
ROUND_TRIP = "decode(encode(p)) == p for every prompt p, apart from characters the vocabulary lacks (unknown tokens)"


@dataclass
class SpecialToken:
    """A special token: its id and text (None when the tokenizer has none)."""

    id: int | None
    text: str | None


@dataclass
class TokenizerFacts:
    """Everything checked about the tokenizer (``round_trip_failures``: prompts that did not come back, with the
    text that did; ``unknown``: those explained by unknown tokens)."""

    kind: str
    vocab_size: int
    prompts: int
    tokens: int
    lossless: int
    round_trip_failures: list[dict[str, Any]]
    unknown_failures: int
    unk_share: float
    byte_fallback_share: float
    eos: SpecialToken
    pad: SpecialToken
    chat_template: bool
    chat_renders: bool | None
    chat_error: str | None
    chat_sample: str | None


def tokenizer_facts(model: Model, prompts: list[str]) -> TokenizerFacts:
    """The facts of ``model``'s tokenizer on ``prompts``: each prompt's round trip (the first failures kept, with what
    came back), the unknown and byte-fallback shares, the special tokens, the chat template rendering one user turn."""
    tok = model.require_tokenizer()
    hf = getattr(tok, "hf", None)
    flat: list[int] = []
    failures: list[dict[str, Any]] = []
    unknown = 0
    for p in prompts:
        with warnings.catch_warnings(action="ignore"):  # the char tokenizer warns of unknown characters: counted here
            got = model.encode(p)
        flat += got
        if (back := model.decode(got)) == p:
            continue
        if model.unk_id in got:
            unknown += 1
        elif len(failures) < EXAMPLES:
            failures.append({"prompt": p, "decoded": back, "ids": got[:64]})
    n = max(1, len(flat))
    unk = 0 if model.unk_id is None else flat.count(model.unk_id)
    byte = sum(1 for t in hf.convert_ids_to_tokens(flat) if isinstance(t, str) and _BYTE_TOKEN.match(t)) if hf else 0
    renders, error, sample = None, None, None
    if model.chat_template is not None:
        try:
            renders, sample = True, model.chat_prompt("Hello")
        except Exception as exc:  # noqa: BLE001 — the template is the model's code: any failure is a finding
            renders, error = False, f"{type(exc).__name__}: {exc}"
    # the tokenizer's own padding id: a transformers tokenizer's (None when it has none; genprobe then pads with the
    # end token or 0 under a mask), the char tokenizer's <pad>
    eos, pad = model.eos_id, tok.pad_id if hf is None else hf.pad_token_id
    return TokenizerFacts(
        kind=tok.kind,
        vocab_size=tok.vocab_size,
        prompts=len(prompts),
        tokens=len(flat),
        lossless=len(prompts) - len(failures) - unknown,
        round_trip_failures=failures,
        unknown_failures=unknown,
        unk_share=unk / n,
        byte_fallback_share=byte / n,
        eos=SpecialToken(eos, _token_text(tok, eos)),
        pad=SpecialToken(None if pad is None else int(pad), _token_text(tok, pad)),
        chat_template=model.chat_template is not None,
        chat_renders=renders,
        chat_error=error,
        chat_sample=sample,
    )


def _token_text(tok: Any, i: int | None) -> str | None:
    try:
        return None if i is None else str(tok.token_str(int(i)))
    except (IndexError, KeyError, ValueError):
        return None


def tokenizer_findings(facts: TokenizerFacts | None, chat: bool, command: str) -> list[Finding]:
    """What the facts mean: a broken round trip is a bug; unknown tokens, an end token equal to padding and a chat
    template that does not render are warnings (a bug when the prompts go through it); the rest is said."""
    if facts is None:
        title, why = "the model has no tokenizer: text checks skipped", "a model directory should ship its tokenizer"
        return [Finding("card", "tokenizer.present", "warning", title, {}, why, command)]
    f, found = facts, list[Finding]()
    ev: dict[str, Any] = {
        "prompts": f.prompts,
        "lossless": f.lossless,
        "unknown": f.unknown_failures,
        "failures": f.round_trip_failures,
    }
    if f.prompts == 0:  # nothing to look at: said, never "ok"
        sev, title = "info", "tokenizer round trip not checked: no prompts (give --prompt or --prompts)"
    elif broken := len(f.round_trip_failures):
        sev, title = "bug", f"tokenizer round trip broken on {broken} prompt(s) without unknown tokens"
    else:
        sev, title = "ok", f"tokenizer round trip lossless on {f.lossless} of {f.prompts} prompts"
    found.append(Finding("card", "tokenizer.round_trip", sev, title, ev, ROUND_TRIP, command))
    ev = {"unk_share": f.unk_share, "byte_fallback_share": f.byte_fallback_share, "tokens": f.tokens}
    crit = f"unknown tokens above {UNK_WARN:.0%} of the prompts' tokens warn; byte-fallback tokens are lossless"
    sev = "warning" if f.unk_share > UNK_WARN else "info" if f.unk_share > 0 else "ok"
    title = f"unknown-token share {f.unk_share:.2%}, byte-fallback share {f.byte_fallback_share:.2%} of the prompts"
    if f.tokens == 0:
        sev, title = "info", "unknown-token share not checked: no prompts"
    found.append(Finding("card", "tokenizer.unknown", sev, title, ev, crit if f.tokens else None, command))
    ev, crit = {"eos": asdict(f.eos), "pad": asdict(f.pad)}, "end-of-text and padding tokens present and distinct"
    if f.eos.id is not None and f.eos.id == f.pad.id:
        sev = "warning"
        title = (
            "end-of-text equals padding: code that builds masks from ids != pad hides real end tokens, and a "
            "fine-tuning collator that masks padding labels stops teaching the model to end"
        )
    elif f.eos.id is None:
        sev, title = "info", "no end-of-text token: generations end only at the length limit"
    elif f.pad.id is None:
        sev, title = "info", "no padding token: batching code must pick one (genprobe pads under a mask)"
    else:
        sev = "ok"
        title = f"end-of-text {f.eos.text!r} (id {f.eos.id}) and padding {f.pad.text!r} (id {f.pad.id}) distinct"
    found.append(Finding("card", "tokenizer.eos_pad", sev, title, ev, crit, command))
    ev = {"present": f.chat_template, "renders": f.chat_renders, "error": f.chat_error, "sample": f.chat_sample}
    sev, title = "ok", "chat template present and rendering"
    if not f.chat_template:
        sev, title = "info", "no chat template"
    elif not f.chat_renders:
        sev, title = "bug" if chat else "warning", f"the chat template fails: {f.chat_error}"
    crit = "a chat template, when present, renders one user turn"
    return found + [Finding("card", "tokenizer.chat_template", sev, title, ev, crit, command)]


# ---- the card ----------------------------------------------------------------------------------------------------
@dataclass
class TensorGroup:
    """Parameters of one tensor type (the name with layer indices as ``*``): dtype, tensors, values."""

    name: str
    dtype: str
    tensors: int
    parameters: int
    gguf_types: dict[str, int] | None = None  # the GGUF file's quantization types of these tensors


@dataclass
class ModelCard:
    """What can be read off the model without running it, and its tokenizer's facts."""

    source: str | None
    kind: str
    arch: str
    parameters: int
    vocab_size: int
    context_length: int | None
    window: int | None
    layers: int
    tensors: list[TensorGroup]
    gguf: dict[str, Any] | None
    generation_defaults: dict[str, Any] | None
    tokenizer: TokenizerFacts | None
    findings: list[Finding] = field(default_factory=list)


def tensor_groups(model: Model) -> list[TensorGroup]:
    """The module's parameters grouped by tensor type, with the GGUF file's quantization types when it had one."""
    groups: dict[tuple[str, str], list[int]] = {}
    for name, p in model.module.named_parameters():
        key = (_LAYER_INDEX.sub(".*.", name), str(p.dtype).replace("torch.", ""))
        groups.setdefault(key, []).append(p.numel())
    out = [TensorGroup(n, dt, len(v), sum(v)) for (n, dt), v in groups.items()]
    gguf = model.meta.get("gguf")
    if gguf:
        by_role: dict[str, Counter[str]] = {}
        for tname, qtype in dict(gguf.get("tensor_types", {})).items():
            by_role.setdefault(_LAYER_INDEX.sub(".*.", tname), Counter())[qtype] += 1
        out += [TensorGroup(f"gguf:{r}", "gguf", sum(c.values()), 0, dict(c)) for r, c in by_role.items()]
    return out


def model_card(run: DoctorRun) -> ModelCard:
    """The card of the run's model and its findings (tokenizer checks on the run's prompts)."""
    model, prompts, opts = run.model, run.inputs.prompts, run.opts
    where = shlex.quote(str(Path(opts.prompts_file).parent / "card")) if opts.prompts_file else "DIR"
    given = opts.prompts_arg() + " " if prompts else ""
    command = f"genprobe doctor {run.arg} {given}--only card --out {where}" + (" --chat" if opts.chat else "")
    facts = None if model.tokenizer is None else tokenizer_facts(model, prompts or [])
    gc = getattr(model.module, "generation_config", None)  # transformers' values that change decoding (None: ours)
    gen = None if gc is None else {k: v for k in GENERATION_KEYS if (v := getattr(gc, k, None)) is not None}
    card = ModelCard(
        source=str(model.source) if model.source else None,
        kind=model.kind,
        arch=model.arch,
        parameters=model.num_parameters(),
        vocab_size=model.vocab_size,
        context_length=model.max_positions,
        window=model.window,
        layers=len(model.mlp_sites()),
        tensors=tensor_groups(model),
        gguf={k: gguf.get(k) for k in GGUF_SUMMARY} if (gguf := model.meta.get("gguf")) else None,
        generation_defaults=gen,
        tokenizer=facts,
    )
    card.findings = tokenizer_findings(facts, opts.chat, command)
    if gen and gen.get("eos_token_id") is not None:  # inside the vocabulary and the tokenizer's (else it stops wrongly)
        ids = gen["eos_token_id"] if isinstance(gen["eos_token_id"], list) else [gen["eos_token_id"]]
        crit = "generation_config.eos_token_id inside the vocabulary and holding the tokenizer's end-of-text id"
        ev = {"generation_eos": ids, "tokenizer_eos": model.eos_id, "vocab_size": model.vocab_size}
        title = None
        if outside := [i for i in ids if not 0 <= int(i) < model.vocab_size]:
            title = f"generation_config stops at id(s) {outside}, outside the {model.vocab_size}-token vocabulary"
        elif model.tokenizer is not None and model.eos_id is not None and model.eos_id not in ids:
            title = f"generation_config stops at id(s) {ids}, the tokenizer's end token is {model.eos_id}"
        if title is not None:
            card.findings.append(Finding("card", "generation.eos", "warning", title, ev, crit, command))
    return card
