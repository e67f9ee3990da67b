"""The model card: architecture, size, weights' dtype (and a GGUF file's quantization) per tensor type, context
length, generation defaults; the tokenizer's facts live in :mod:`genprobe.doctor.tokenizer_facts`."""

from __future__ import annotations

import re
import shlex
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..model.load import Model
from .findings import Finding
from .options import DoctorRun
from .tokenizer_facts import TokenizerFacts, tokenizer_facts, tokenizer_findings

_LAYER_INDEX = re.compile(r"\.\d+\.")
GGUF_SUMMARY = ("path", "architecture", "name", "context_length", "type_counts", "sha256")
_GGUF_BLOCK = re.compile(r"^blk\.\d+\.")
GENERATION_KEYS = tuple(
    "do_sample temperature top_k top_p min_p repetition_penalty no_repeat_ngram_size max_new_tokens max_length "
    "bos_token_id eos_token_id pad_token_id".split()
)


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


def gguf_role(name: str) -> str:
    """A GGUF tensor name with its block index as ``*`` (``blk.3.attn_q.weight`` → ``blk.*.attn_q.weight``)."""
    return _GGUF_BLOCK.sub("blk.*.", name)


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
            by_role.setdefault(gguf_role(tname), Counter())[qtype] += 1
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
    facts = None if model.tokenizer is None else tokenizer_facts(model, prompts or [], opts.chat)
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
