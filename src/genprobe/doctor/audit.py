"""The static audit stage: the model's files read as data, nothing executed (docs/doctor.md, "Static audit", lists the
checks). A GGUF file's header is checked against itself, parsed once by the ``gguf`` package's reader
(:func:`genprobe.model.gguf.header_reader`, shared with the loader); a ``transformers`` directory's ``auto_map`` code is
named, never run — genprobe never trusts remote code. The checks both share (the chat template, hidden text, special
ids) are in :mod:`.metadata_audit`. A directory converted from GGUF is audited as a transformers directory and, when
its GGUF file is still there, as that file too."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._io import NOT_JSON, read_json_object
from .metadata_audit import analyse_template, metadata_findings, special_id_findings, template_findings, text_fields
from .options import DoctorRun, Finding, StageSkipped


@dataclass
class StaticAudit:
    """What the audit read (``kind``: gguf, transformers, genprobe) and found."""

    path: str
    kind: str
    facts: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list, metadata=NOT_JSON)


def static_audit(path: str | Path, chat: bool = False, command: str | None = None) -> StaticAudit:
    """Audit the model at ``path`` (a GGUF file or a directory holding one, a transformers directory, a genprobe
    checkpoint) without loading or running it; every finding's command is ``command``."""
    from ..model.checkpoint import is_checkpoint
    from ..model.gguf import gguf_file_of, read_sidecar
    from ..model.kinds import ModelKind, model_kind

    p = Path(path)
    if model_kind(p) is ModelKind.GGUF:
        audit = StaticAudit(str(gguf_file_of(p)), "gguf", *audit_gguf(str(gguf_file_of(p)), chat))
    elif p.is_dir() and (p / "config.json").is_file():
        audit = StaticAudit(str(p), "transformers", *audit_hf_dir(p, chat))
        origin = (read_sidecar(p) or {}).get("path")
        if isinstance(origin, str) and Path(origin).is_file():
            audit.facts["gguf"], gfound = audit_gguf(origin, chat)
            audit.findings += [f for f in gfound if not f.check.startswith(("template.", "metadata."))]
    else:
        kind = "genprobe" if p.is_dir() and is_checkpoint(p) else "unknown"
        title = (
            f"static audit not checked: {p} is a {kind} model, whose files hold no template, metadata or quantization"
        )
        audit = StaticAudit(str(p), kind, {}, [Finding("audit", "audit.skipped", "info", title)])
    for f in audit.findings:
        f.command = command or f"genprobe doctor {path} --only audit --out DIR"
    return audit


def audit_stage(run: DoctorRun) -> StaticAudit:
    """The stage: the loaded model's files (none for a model built in memory)."""
    if run.model.source is None:
        raise StageSkipped("the model was built in memory: no files to read")
    return static_audit(run.model.source, run.opts.chat, f"genprobe doctor {run.arg} --only audit --out DIR")


@dataclass
class ModelFiles:
    """A model's files, not loaded: what a run of the audit stage alone needs (no tokenizer, nothing to run)."""

    source: Path
    tokenizer: None = None
    chat_template: None = None


def model_files(path: str | Path) -> ModelFiles:
    """``path`` or a fetched model's catalog name, resolved to its files without loading them."""
    from ..model.errors import ModelLoadError
    from ..model.kinds import is_url

    if is_url(path):
        raise ModelLoadError(f"{path} is a URL: the audit reads model files on this machine")
    p = Path(path)
    if not p.exists():
        from ..model.catalog import resolve_name

        p = resolve_name(str(path))
    return ModelFiles(p)


# ---- a GGUF file --------------------------------------------------------------------------------
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
    except (ValueError, KeyError, IndexError, OSError, EOFError) as exc:  # a duplicate key or tensor named, else as is
        msg, facts = str(exc.args[0]) if exc.args else str(exc), {"path": path, "readable": False}  # KeyError quotes
        dup = re.match(r"Duplicate (\S+) already in list", msg) or re.search(r"duplicated tensor with name (\S+)", msg)
        if dup:
            what = "metadata key" if msg.startswith("Duplicate") else "tensor"
            title = f"duplicate {what} {dup.group(1)!r}: readers disagree on which copy counts (gguf refuses the file)"
            crit = "every metadata key and tensor name appears once"
            return facts, [Finding("audit", "gguf.duplicates", "bug", title, {"error": msg}, crit)]
        title = f"the GGUF header cannot be read: {type(exc).__name__}: {msg}"
        return facts, [
            Finding("audit", "gguf.header", "bug", title, {"error": msg}, "the gguf package reads the header")
        ]
    findings = [_special_ids(reader), _file_type(reader), _structure(reader), *_vocab_rows(reader), _overlaps(reader)]
    findings += metadata_findings(
        text_fields({k: f.contents() for k, f in reader.fields.items() if k not in _VOCAB_ARRAYS})
    )
    template = _value(reader, "tokenizer.chat_template")
    if isinstance(template, str):
        findings += template_findings(analyse_template(template, "tokenizer.chat_template"), chat)
    facts = {"path": path, "readable": True, "tensors": len(reader.tensors), "matrix_types": _weight_types(reader)}
    return facts, findings


# ---- a transformers directory -------------------------------------------------------------------
# normalizers that change what the user typed (Replace is judged by its pattern: SentencePiece's " " → "▁" is not)
LOSSY_NORMALIZERS = {"Lowercase", "StripAccents", "Strip", "NFKC", "NFKD", "Precompiled", "BertNormalizer"}
_SPACE_MARKERS = {("\u0020", "\u2581")}


def _json(path: Path, unreadable: list[str]) -> dict[str, Any] | None:
    """The JSON object in ``path`` (None when absent; a file that holds no JSON object is added to ``unreadable``)."""
    if not path.is_file():
        return None
    try:
        return read_json_object(path)
    except ValueError:
        unreadable.append(path.name)
        return None


def _auto_map(d: Path, configs: dict[str, Any]) -> Finding:
    maps = {name: c.get("auto_map", {}) for name, c in configs.items() if isinstance(c, dict)}
    entries = {f"{name}: {k}": v for name, m in maps.items() for k, v in m.items()}
    code = sorted(p.name for p in d.glob("*.py"))
    crit = "a model directory is data; code that trust_remote_code would import runs with your rights on load"
    ev: dict[str, Any] = {"auto_map": entries, "python_files": code}
    shown = ", ".join(f"{k} → {v}" for k, v in list(entries.items())[:3]) or ", ".join(code[:3])
    title = f"custom code that trust_remote_code=True would run: {shown} (reported, never executed)"
    if not (entries or code):
        title = "no auto_map and no Python files: nothing to trust"
    return Finding("audit", "hf.auto_map", "warning" if entries or code else "ok", title, ev, crit)


def _config_ids(config: dict[str, Any]) -> Finding:
    inner = config.get("text_config")
    text: dict[str, Any] = inner if isinstance(inner, dict) else config
    n = text.get("vocab_size")
    ids = {k: text.get(k) for k in ("bos_token_id", "eos_token_id", "pad_token_id") if text.get(k) is not None}
    crit = "every special-token id in config.json is below vocab_size"
    return special_id_findings("hf.special_ids", ids, n if isinstance(n, int) else None, crit)


def _suppressions(gen: dict[str, Any] | None, config: dict[str, Any]) -> list[Finding]:
    keys = ("suppress_tokens", "begin_suppress_tokens", "bad_words_ids")
    found = {k: gen[k] for k in keys if gen.get(k)} if gen is not None else {}
    if gen is None or not found:
        return []
    eos = gen.get("eos_token_id", config.get("eos_token_id"))
    eos_ids = set(eos if isinstance(eos, list) else [eos]) - {None}
    flat = {int(i) for v in found.values() for i in (v if isinstance(v, list) else [v]) if isinstance(i, int)}
    flat |= {int(i) for v in found.get("bad_words_ids", []) if isinstance(v, list) for i in v if isinstance(i, int)}
    ev = {"suppressed": found, "eos": sorted(eos_ids)}
    crit = "generation_config.json suppressions change every reply; suppressing the end token means replies never end"
    title = f"generation_config.json suppresses {len(flat)} token(s) in every reply: {', '.join(found)}"
    if flat & eos_ids:
        title = f"generation_config.json suppresses the end token {sorted(flat & eos_ids)}: replies end at the limit"
    return [Finding("audit", "hf.generation_config", "warning" if flat & eos_ids else "info", title, ev, crit)]


def _normalizer_steps(node: Any) -> list[dict[str, Any]]:
    if not isinstance(node, dict):
        return []
    if node.get("type") == "Sequence":
        return [s for n in node.get("normalizers", []) for s in _normalizer_steps(n)]
    return [node]


def _normalizers(tokenizer: dict[str, Any] | None) -> list[Finding]:
    if tokenizer is None:
        return []
    steps = _normalizer_steps(tokenizer.get("normalizer"))
    lossy = []
    for s in steps:
        pattern = s.get("pattern", {})
        pat = pattern.get("String", pattern.get("Regex")) if isinstance(pattern, dict) else None
        if s.get("type") in LOSSY_NORMALIZERS:
            lossy.append(str(s.get("type")))
        elif s.get("type") == "Replace" and (pat, s.get("content")) not in _SPACE_MARKERS:
            lossy.append(f"Replace {pat!r} → {s.get('content')!r}")
    names = ", ".join(str(s.get("type")) for s in steps) or "none"
    title = f"tokenizer.json rewrites the input before tokenizing: {'; '.join(lossy[:3])}"
    crit = "a normalizer rewrites text before the model sees it: what it removes, the model cannot read"
    sev, title = ("warning", title) if lossy else ("ok", f"tokenizer.json normalizers: {names}")
    return [Finding("audit", "hf.normalizer", sev, title, {"normalizers": steps}, crit)]


def audit_hf_dir(d: Path, chat: bool) -> tuple[dict[str, Any], list[Finding]]:
    """Every static check of the transformers directory ``d``: (facts, findings)."""
    unreadable: list[str] = []
    config = _json(d / "config.json", unreadable) or {}
    tok_config = _json(d / "tokenizer_config.json", unreadable)
    gen = _json(d / "generation_config.json", unreadable)
    tokenizer = _json(d / "tokenizer.json", unreadable)
    findings: list[Finding] = []
    if unreadable:
        title = f"{', '.join(unreadable)}: not a JSON object, not checked (a loader refuses or ignores it)"
        findings.append(Finding("audit", "hf.json", "warning", title, {"files": unreadable}))
    findings += [_auto_map(d, {"config.json": config, "tokenizer_config.json": tok_config}), _config_ids(config)]
    findings += _suppressions(gen, config) + _normalizers(tokenizer)
    templates: dict[str, str] = {}  # where -> the chat template
    if (d / "chat_template.jinja").is_file():
        templates["chat_template.jinja"] = (d / "chat_template.jinja").read_text(encoding="utf-8", errors="replace")
    raw = (tok_config or {}).get("chat_template")
    if isinstance(raw, str):
        templates["tokenizer_config.json chat_template"] = raw
    for t in raw if isinstance(raw, list) else []:
        if isinstance(t, dict) and isinstance(t.get("template"), str):
            templates[f"tokenizer_config.json chat_template {t.get('name')!r}"] = t["template"]
    files = {"config.json": config, "tokenizer_config.json": tok_config, "generation_config.json": gen}
    findings += metadata_findings(text_fields(files) | templates)
    for name, text in templates.items():
        findings += template_findings(analyse_template(text, name), chat)
    facts = {"path": str(d), "templates": sorted(templates), "has_tokenizer_json": tokenizer is not None}
    return facts, findings
