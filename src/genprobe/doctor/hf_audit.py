"""A ``transformers`` model directory read as files, never executed (docs/doctor.md, "Static audit", lists the checks):
``auto_map`` code is named, never run — genprobe never trusts remote code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._io import read_json_object
from .metadata_audit import analyse_template, metadata_findings, special_id_findings, template_findings, text_fields
from .options import Finding

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


def _special_ids(config: dict[str, Any]) -> Finding:
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


def _templates(d: Path, tok_config: dict[str, Any] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    if (d / "chat_template.jinja").is_file():
        out["chat_template.jinja"] = (d / "chat_template.jinja").read_text(encoding="utf-8", errors="replace")
    raw = (tok_config or {}).get("chat_template")
    if isinstance(raw, str):
        out["tokenizer_config.json chat_template"] = raw
    elif isinstance(raw, list):
        for t in raw:
            if isinstance(t, dict) and isinstance(t.get("template"), str):
                out[f"tokenizer_config.json chat_template {t.get('name')!r}"] = t["template"]
    return out


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
    findings += [_auto_map(d, {"config.json": config, "tokenizer_config.json": tok_config}), _special_ids(config)]
    findings += _suppressions(gen, config) + _normalizers(tokenizer)
    templates = _templates(d, tok_config)
    files = {"config.json": config, "tokenizer_config.json": tok_config, "generation_config.json": gen}
    findings += metadata_findings(text_fields(files) | templates)
    for name, text in templates.items():
        findings += template_findings(analyse_template(text, name), chat)
    facts = {"path": str(d), "templates": sorted(templates), "has_tokenizer_json": tokenizer is not None}
    return facts, findings
