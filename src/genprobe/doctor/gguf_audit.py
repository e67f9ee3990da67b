"""A GGUF file's header checked against itself, nothing run (docs/doctor.md, "Static audit", lists the checks), parsed
once by the ``gguf`` package's reader (:func:`genprobe.model.gguf.header_reader`, shared with the loader)."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from .metadata_audit import analyse_template, metadata_findings, special_id_findings, template_findings, text_fields
from .options import Finding

_BLOCK = re.compile(r"^blk\.(\d+)\.")
HPARAMS = (
    *("block_count", "embedding_length", "feed_forward_length", "attention.key_length", "attention.value_length"),
    *("rope.dimension_count", "vocab_size", "attention.head_count", "attention.head_count_kv"),
)
_VOCAB_ARRAYS = {"tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type", "tokenizer.ggml.scores"}


def _value(reader: Any, key: str) -> Any:
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def _vocabulary(reader: Any) -> int | None:
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    return None if tokens is None else len(tokens.data)


def _unreadable(exc: Exception) -> Finding:
    """A header the reader refuses: a duplicate key or tensor named, anything else said as it is."""
    msg = str(exc.args[0]) if exc.args else str(exc)  # a KeyError's str() quotes its message
    dup = re.match(r"Duplicate (\S+) already in list", msg) or re.search(r"duplicated tensor with name (\S+)", msg)
    if dup:
        what = "metadata key" if msg.startswith("Duplicate") else "tensor"
        title = f"duplicate {what} {dup.group(1)!r}: readers disagree on which copy counts (gguf refuses the file)"
        crit = "every metadata key and tensor name appears once"
        return Finding("audit", "gguf.duplicates", "bug", title, {"error": msg}, crit)
    title = f"the GGUF header cannot be read: {type(exc).__name__}: {msg}"
    return Finding("audit", "gguf.header", "bug", title, {"error": msg}, "the gguf package reads the header")


def _special_ids(reader: Any) -> Finding:
    from ..model.gguf import SPECIAL_ID_KEYS

    ids = {k.split(".")[-1]: v for k in SPECIAL_ID_KEYS if (v := _value(reader, k)) is not None}
    crit = "every tokenizer.ggml.*_token_id names a token of the vocabulary"
    return special_id_findings("gguf.special_ids", ids, _vocabulary(reader), crit, _special_harm)


def _special_harm(bad: dict[str, Any]) -> str:
    """Why an id past the vocabulary matters: llama.cpp ignores it (llama-vocab.cpp keeps its default id), transformers
    raises IndexError loading the tokenizer, genprobe loads the model without it."""
    if "eos_token_id" in bad or "eot_token_id" in bad:
        return "no reply can end on the end token; llama.cpp falls back to its default id, transformers cannot load it"
    if "bos_token_id" in bad:
        return "prompts do not start the way the model was trained; llama.cpp falls back to its default id"
    return "llama.cpp falls back to its default id, transformers cannot load the tokenizer"


def _weight_types(reader: Any) -> dict[str, int]:
    """How many matrices (tensors of 2 or more dimensions) of each ggml type."""
    return dict(Counter(t.tensor_type.name for t in reader.tensors if len(t.shape) >= 2).most_common())


def _file_type(reader: Any) -> Finding:
    import gguf

    raw, types = _value(reader, "general.file_type"), _weight_types(reader)
    crit = "the type general.file_type names is the type of the file's matrices (a few, e.g. the embedding, may differ)"
    ev: dict[str, Any] = {"file_type": raw, "matrix_types": types}
    if raw is None:
        return Finding("audit", "gguf.file_type", "info", "no general.file_type: quantization label not checked", ev)
    try:
        label = gguf.LlamaFileType(int(raw) & ~gguf.LlamaFileType.GUESSED).name
    except ValueError:
        title = f"general.file_type {raw} is not a llama.cpp file type"
        return Finding("audit", "gguf.file_type", "warning", title, ev, crit)
    ev["label"] = label = label.removeprefix("MOSTLY_").removeprefix("ALL_")
    listed = ", ".join(f"{k} ×{v}" for k, v in types.items())
    matches = any(label == t or label.startswith(t + "_") for t in types)
    title = f"general.file_type {label} matches the matrices ({listed})"
    if not matches:
        title = (
            f"general.file_type says {label} but no matrix is {label} ({listed}): the label tools and catalogs show "
            "(size, quality, speed) is not what the file holds"
        )
    return Finding("audit", "gguf.file_type", "ok" if matches else "warning", title, ev, crit)


def _expected_shapes(hp: dict[str, Any], n_vocab: int | None, kd: int | None) -> dict[str, list[int | None]]:
    """Each tensor's ggml shape as the hyper-parameters say (None: not stated)."""
    e, h, kv = hp["embedding_length"], hp["attention.head_count"], hp["attention.head_count_kv"]
    vd = hp["attention.value_length"] or kd
    mul = lambda a, b: a * b if a is not None and b is not None else None  # noqa: E731
    out: dict[str, list[int | None]] = {"token_embd.weight": [e, n_vocab], "output.weight": [e, n_vocab]}
    for i in range(hp["block_count"] or 0):
        ff = hp["feed_forward_length"]
        ff = ff[i] if isinstance(ff, list) and i < len(ff) else ff
        attn = {"q": [e, mul(h, kd)], "k": [e, mul(kv, kd)], "v": [e, mul(kv, vd)], "output": [mul(h, vd), e]}
        out |= {f"blk.{i}.attn_{k}.weight": v for k, v in attn.items()}
        out |= {f"blk.{i}.ffn_{k}.weight": v for k, v in {"gate": [e, ff], "up": [e, ff], "down": [ff, e]}.items()}
    return out


def _structure(reader: Any) -> Finding:
    """What the hyper-parameters say and the tensors contradict (layer count, widths, heads, feed-forward size)."""
    arch = _value(reader, "general.architecture")
    hp = {k: _value(reader, f"{arch}.{k}") for k in HPARAMS}
    h, e, rope, n_layer = (
        hp[k] for k in ("attention.head_count", "embedding_length", "rope.dimension_count", "block_count")
    )
    kv = hp["attention.head_count_kv"] = hp["attention.head_count_kv"] or h
    kd = hp["attention.key_length"] or (e // h if e and h else None)
    n_vocab = _vocabulary(reader)
    shapes = {t.name: [int(x) for x in t.shape] for t in reader.tensors}
    found = {int(m.group(1)) for name in shapes if (m := _BLOCK.match(name))}
    bad: list[str] = []
    if n_layer is not None and found and found != set(range(n_layer)):
        bad.append(f"block_count {n_layer}, tensors for blocks {min(found)}..{max(found)} ({len(found)} blocks)")
    for name, want in _expected_shapes(hp, n_vocab, kd).items():
        got = shapes.get(name)
        if got is not None and any(w is not None and w != g for w, g in zip(want, got, strict=False)):
            bad.append(f"{name} is {got}, the hyper-parameters say {[w if w else '?' for w in want]}")
    if h and kv and h % kv:
        bad.append(f"head_count {h} is not a multiple of head_count_kv {kv}")
    if rope and kd and rope > kd:
        bad.append(f"rope.dimension_count {rope} exceeds the head width {kd}")
    if hp["vocab_size"] is not None and n_vocab is not None and hp["vocab_size"] != n_vocab:
        bad.append(f"{arch}.vocab_size {hp['vocab_size']} but the vocabulary lists {n_vocab} tokens")
    ev = {"architecture": arch, "hparams": hp, "vocabulary": n_vocab, "blocks_found": len(found), "mismatches": bad}
    crit = "the hyper-parameters a loader builds the model from agree with the tensors' shapes"
    title = f"structure: {n_layer} blocks, widths and head counts agree with the tensors"
    if bad:
        title = f"structure: {len(bad)} contradiction(s) between the config and the tensors: {'; '.join(bad[:2])}"
    return Finding("audit", "gguf.structure", "bug" if bad else "ok", title, ev, crit)


def _overlaps(reader: Any) -> Finding:
    spans = sorted((int(t.data_offset), int(t.data_offset) + int(t.n_bytes), t.name) for t in reader.tensors)
    hits = [f"{a[2]} and {b[2]}" for a, b in zip(spans, spans[1:], strict=False) if b[0] < a[1]]
    ev = {"tensors": len(spans), "overlapping": hits}
    sev, title = "ok", f"{len(spans)} tensors, no overlapping data"
    if hits:
        sev, title = "bug", f"{len(hits)} tensor pair(s) share bytes, e.g. {hits[0]}: writing one changes the other"
    return Finding("audit", "gguf.overlap", sev, title, ev, "each tensor's bytes belong to it alone")


def _vocab_rows(reader: Any) -> list[Finding]:
    n, emb = _vocabulary(reader), next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if n is None or emb is None or len(emb.shape) < 2:
        return []
    rows = int(emb.shape[1])
    title = f"vocabulary and embedding both {n}"
    if n > rows:
        title = f"the vocabulary has {n} tokens, the embedding {rows} rows: ids {rows}..{n - 1} index past it"
    elif n < rows:
        title = f"the embedding has {rows - n} rows beyond the {n}-token vocabulary (padding rows, never produced)"
    sev = "bug" if n > rows else "info" if n < rows else "ok"
    ev = {"vocabulary": n, "embedding_rows": rows}
    return [Finding("audit", "gguf.vocab", sev, title, ev, "every token id has an embedding row")]


def audit_gguf(path: str, chat: bool) -> tuple[dict[str, Any], list[Finding]]:
    """Every static check of the GGUF file ``path``: (facts, findings)."""
    from ..model.gguf import header_reader

    try:
        reader = header_reader(path)
    except (ValueError, KeyError, IndexError, OSError, EOFError) as exc:
        return {"path": path, "readable": False}, [_unreadable(exc)]
    findings = [_special_ids(reader), _file_type(reader), _structure(reader), *_vocab_rows(reader), _overlaps(reader)]
    findings += metadata_findings(
        text_fields({k: f.contents() for k, f in reader.fields.items() if k not in _VOCAB_ARRAYS})
    )
    template = _value(reader, "tokenizer.chat_template")
    if isinstance(template, str):
        findings += template_findings(analyse_template(template, "tokenizer.chat_template"), chat)
    facts = {"path": path, "readable": True, "tensors": len(reader.tensors), "matrix_types": _weight_types(reader)}
    return facts, findings
