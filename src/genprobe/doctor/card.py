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
Judged = tuple[str, str, dict[str, Any], str | None]  # (severity, title, evidence, criterion) of one check
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


def _token_text(tok: Any, i: int | None) -> str | None:
    try:
        return None if i is None else str(tok.token_str(int(i)))
    except (IndexError, KeyError, ValueError):
        return None


def _raw_pad(tok: Any) -> int | None:
    """The tokenizer's own padding id: a transformers tokenizer's ``pad_token_id`` (None when it has none; genprobe
    then pads with the end token or 0 under a mask), the char tokenizer's ``<pad>``."""
    hf = getattr(tok, "hf", None)
    pad = tok.pad_id if hf is None else hf.pad_token_id
    return None if pad is None else int(pad)


def _byte_tokens(tok: Any, ids: list[int]) -> int:
    hf = getattr(tok, "hf", None)
    if hf is None or not ids:
        return 0
    return sum(1 for t in hf.convert_ids_to_tokens(ids) if isinstance(t, str) and _BYTE_TOKEN.match(t))


def _round_trip(model: Model, prompts: list[str]) -> tuple[list[list[int]], list[dict[str, Any]], int]:
    """Each prompt's ids, the prompts that did not come back (with what did) and how many of those hold unknowns."""
    ids: list[list[int]] = []
    failures: list[dict[str, Any]] = []
    unknown = 0
    for p in prompts:
        with warnings.catch_warnings(action="ignore"):  # the char tokenizer warns of unknown characters: counted here
            got = model.encode(p)
        ids.append(got)
        back = model.decode(got)
        if back == p:
            continue
        if model.unk_id in got:
            unknown += 1
        elif len(failures) < EXAMPLES:
            failures.append({"prompt": p, "decoded": back, "ids": got[:64]})
    return ids, failures, unknown


def _chat(model: Model) -> tuple[bool | None, str | None, str | None]:
    """Whether the chat template renders one user turn (None without a template), the error, the rendering."""
    if model.chat_template is None:
        return None, None, None
    try:
        return True, None, model.chat_prompt("Hello")
    except Exception as exc:  # noqa: BLE001 — the template is the model's code: any failure is a finding
        return False, f"{type(exc).__name__}: {exc}", None


def tokenizer_facts(model: Model, prompts: list[str]) -> TokenizerFacts:
    """The facts of ``model``'s tokenizer on ``prompts``."""
    tok = model.require_tokenizer()
    ids, failures, unknown = _round_trip(model, prompts)
    flat = [i for seq in ids for i in seq]
    n = max(1, len(flat))
    unk = 0 if model.unk_id is None else flat.count(model.unk_id)
    renders, error, sample = _chat(model)
    eos, pad = model.eos_id, _raw_pad(tok)
    return TokenizerFacts(
        kind=tok.kind,
        vocab_size=tok.vocab_size,
        prompts=len(prompts),
        tokens=len(flat),
        lossless=len(prompts) - len(failures) - unknown,
        round_trip_failures=failures,
        unknown_failures=unknown,
        unk_share=unk / n,
        byte_fallback_share=_byte_tokens(tok, flat) / n,
        eos=SpecialToken(eos, _token_text(tok, eos)),
        pad=SpecialToken(pad, _token_text(tok, pad)),
        chat_template=model.chat_template is not None,
        chat_renders=renders,
        chat_error=error,
        chat_sample=sample,
    )


def tokenizer_findings(facts: TokenizerFacts | None, chat: bool, command: str) -> list[Finding]:
    """What the facts mean: a broken round trip is a bug; unknown tokens, an end token equal to padding and a chat
    template that does not render are warnings (a bug when the prompts go through it); the rest is said."""
    if facts is None:
        title, crit = "the model has no tokenizer: text checks skipped", "a model directory should ship its tokenizer"
        return [Finding("card", "tokenizer.present", "warning", title, {}, crit, command)]
    checks = (
        ("tokenizer.round_trip", _round_trip_finding(facts)),
        ("tokenizer.unknown", _unknown_finding(facts)),
        ("tokenizer.eos_pad", _special_finding(facts)),
        ("tokenizer.chat_template", _chat_finding(facts, chat)),
    )
    return [Finding("card", check, sev, title, ev, crit, command) for check, (sev, title, ev, crit) in checks]


def _round_trip_finding(f: TokenizerFacts) -> Judged:
    ev = {
        "prompts": f.prompts,
        "lossless": f.lossless,
        "unknown": f.unknown_failures,
        "failures": f.round_trip_failures,
    }
    broken = len(f.round_trip_failures)
    if f.prompts == 0:  # nothing to look at: said, never "ok"
        return "info", "tokenizer round trip not checked: no prompts (give --prompt or --prompts)", ev, ROUND_TRIP
    if broken:
        return "bug", f"tokenizer round trip broken on {broken} prompt(s) without unknown tokens", ev, ROUND_TRIP
    return "ok", f"tokenizer round trip lossless on {f.lossless} of {f.prompts} prompts", ev, ROUND_TRIP


def _unknown_finding(f: TokenizerFacts) -> Judged:
    ev = {"unk_share": f.unk_share, "byte_fallback_share": f.byte_fallback_share, "tokens": f.tokens}
    if f.tokens == 0:
        return "info", "unknown-token share not checked: no prompts", ev, None
    crit = f"unknown tokens above {UNK_WARN:.0%} of the prompts' tokens warn; byte-fallback tokens are lossless"
    sev = "warning" if f.unk_share > UNK_WARN else "info" if f.unk_share > 0 else "ok"
    title = f"unknown-token share {f.unk_share:.2%}, byte-fallback share {f.byte_fallback_share:.2%} of the prompts"
    return sev, title, ev, crit


def _special_finding(f: TokenizerFacts) -> Judged:
    ev = {"eos": asdict(f.eos), "pad": asdict(f.pad)}
    crit = "end-of-text and padding tokens present and distinct"
    if f.eos.id is not None and f.eos.id == f.pad.id:
        why = (
            "end-of-text equals padding: code that builds masks from ids != pad hides real end tokens, and a "
            "fine-tuning collator that masks padding labels stops teaching the model to end"
        )
        return "warning", why, ev, crit
    if f.eos.id is None:
        return "info", "no end-of-text token: generations end only at the length limit", ev, crit
    if f.pad.id is None:
        return "info", "no padding token: batching code must pick one (genprobe pads under a mask)", ev, crit
    title = f"end-of-text {f.eos.text!r} (id {f.eos.id}) and padding {f.pad.text!r} (id {f.pad.id}) distinct"
    return "ok", title, ev, crit


def _chat_finding(f: TokenizerFacts, chat: bool) -> Judged:
    crit = "a chat template, when present, renders one user turn"
    ev = {"present": f.chat_template, "renders": f.chat_renders, "error": f.chat_error, "sample": f.chat_sample}
    if not f.chat_template:
        return "info", "no chat template", ev, crit
    if not f.chat_renders:
        return "bug" if chat else "warning", f"the chat template fails: {f.chat_error}", ev, crit
    return "ok", "chat template present and rendering", ev, crit


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


def generation_defaults(model: Model) -> dict[str, Any] | None:
    """The transformers ``generation_config`` values that change decoding (None for a genprobe checkpoint)."""
    gc = getattr(model.module, "generation_config", None)
    if gc is None:
        return None
    return {k: getattr(gc, k, None) for k in GENERATION_KEYS if getattr(gc, k, None) is not None}


def model_card(run: DoctorRun) -> ModelCard:
    """The card of the run's model and its findings (tokenizer checks on the run's prompts)."""
    model, prompts, opts = run.model, run.inputs.prompts, run.opts
    where = shlex.quote(str(Path(opts.prompts_file).parent / "card")) if opts.prompts_file else "DIR"
    given = opts.prompts_arg() + " " if prompts else ""
    command = f"genprobe doctor {run.arg} {given}--only card --out {where}" + (" --chat" if opts.chat else "")
    facts = None if model.tokenizer is None else tokenizer_facts(model, prompts or [])
    gen = generation_defaults(model)
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
    card.findings = tokenizer_findings(facts, opts.chat, command) + _generation_findings(model, gen, command)
    return card


def _generation_findings(model: Model, gen: dict[str, Any] | None, command: str) -> list[Finding]:
    """The generation config's end token: inside the vocabulary, and the tokenizer's (a mismatch stops generation
    at the wrong id, or never)."""
    if not gen or gen.get("eos_token_id") is None:
        return []
    ids = gen["eos_token_id"] if isinstance(gen["eos_token_id"], list) else [gen["eos_token_id"]]
    crit = "generation_config.eos_token_id inside the vocabulary and holding the tokenizer's end-of-text id"
    ev = {"generation_eos": ids, "tokenizer_eos": model.eos_id, "vocab_size": model.vocab_size}
    outside = [i for i in ids if not 0 <= int(i) < model.vocab_size]
    if outside:
        title = f"generation_config stops at id(s) {outside}, outside the {model.vocab_size}-token vocabulary"
        return [Finding("card", "generation.eos", "warning", title, ev, crit, command)]
    if model.tokenizer is None or model.eos_id is None or model.eos_id in ids:
        return []
    title = f"generation_config stops at id(s) {ids}, the tokenizer's end token is {model.eos_id}"
    return [Finding("card", "generation.eos", "warning", title, ev, crit, command)]
