"""The static audit stage: the model's files read as data, nothing executed (docs/doctor.md lists the checks). One
module per kind of file: :mod:`.gguf_audit`, :mod:`.hf_audit`, and the chat template's :mod:`.template_audit`; the
metadata checks both kinds share live here. A directory converted from GGUF is audited as a transformers directory
and, when its GGUF file is still there, as that file too."""

from __future__ import annotations

import numbers
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .._io import NOT_JSON
from .findings import Finding
from .options import DoctorRun, StageSkipped

BIDI = {0x200E, 0x200F, 0x061C, *range(0x202A, 0x202F), *range(0x2066, 0x206A)}  # "Trojan Source", CVE-2021-42574
_URL = re.compile(r"\b(?:https?|ftp|file)://[^\s'\"<>)]+", re.IGNORECASE)


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
    from .gguf_audit import audit_gguf
    from .hf_audit import audit_hf_dir

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


# ---- metadata checks shared by the GGUF and transformers audits -----------------------------------------------------
def hidden_characters(text: str) -> list[str]:
    """The invisible characters of ``text`` (format, private-use and control characters but newline and tab) as
    ``U+XXXX NAME``, bidirectional controls first."""
    seen: dict[str, bool] = {}
    for ch in text:
        cat = unicodedata.category(ch)
        if ch not in "\n\r\t" and cat in ("Cf", "Co", "Cc"):
            seen.setdefault(f"U+{ord(ch):04X} {unicodedata.name(ch, cat)}", ord(ch) in BIDI)
    return sorted(seen, key=lambda k: not seen[k])


def text_fields(obj: Any, where: str = "") -> dict[str, str]:
    """Every string inside ``obj`` (dicts and lists walked) by where it sits (``config.json.a.b[0]``)."""
    if isinstance(obj, str):
        return {where: obj}
    if isinstance(obj, dict):
        items = [(f"{where}.{k}" if where else str(k), v) for k, v in obj.items()]
    elif isinstance(obj, list):
        items = [(f"{where}[{i}]", v) for i, v in enumerate(obj)]
    else:
        return {}
    return {k: text for w, v in items for k, text in text_fields(v, w).items()}


def metadata_findings(strings: dict[str, str]) -> list[Finding]:
    """Findings on the strings a model file carries but its vocabulary (where -> text; a vocabulary's tokens may
    legitimately be zero-width joiners and the like): hidden characters warn (bidi controls named), URLs are said."""
    hidden = {k: h for k, v in strings.items() if (h := hidden_characters(v))}
    urls = {k: u for k, v in strings.items() if (u := sorted(set(_URL.findall(v))))}
    out: list[Finding] = []
    crit = "metadata and templates are read by people and rendered into prompts: what they say must be what they show"
    if hidden:
        where, chars = next(iter(hidden.items()))
        bidi = any(ord(ch) in BIDI for k in hidden for ch in strings[k])
        kind = "bidirectional-control" if bidi else "invisible"
        title = f"{kind} characters in {len(hidden)} metadata field(s), e.g. {where}: {', '.join(chars[:3])}"
        out.append(Finding("audit", "metadata.hidden_text", "warning", title, {"fields": hidden}, crit))
    if urls:
        where, found = next(iter(urls.items()))
        title = f"URLs in {len(urls)} metadata field(s), e.g. {where}: {found[0]}"
        out.append(Finding("audit", "metadata.urls", "info", title, {"fields": urls}, "said, not judged: check them"))
    if not out:
        title = f"{len(strings)} metadata strings: no hidden characters, no URLs"
        out.append(Finding("audit", "metadata.hidden_text", "ok", title, {"fields": len(strings)}, crit))
    return out


def special_id_findings(
    check: str, ids: dict[str, Any], n: int | None, crit: str, harm: Callable[[dict], str] | None = None
) -> Finding:
    """Special-token ids (name -> an id or a list of ids) against an ``n``-token vocabulary: one outside it is a bug
    (``harm`` says what follows), none declared is not checked."""
    ev = {"ids": ids, "vocabulary": n}
    if n is None or not ids:
        return Finding("audit", check, "info", "special-token ids not checked: none declared", ev)
    flat = {k: v for k, vs in ids.items() for v in (vs if isinstance(vs, list) else [vs])}
    bad = {k: v for k, v in flat.items() if not (isinstance(v, numbers.Integral) and 0 <= int(v) < n)}
    if not bad:
        return Finding("audit", check, "ok", f"{len(ids)} special-token ids inside the {n}-token vocabulary", ev, crit)
    names = ", ".join(f"{k} = {v}" for k, v in bad.items())
    title = f"special-token id(s) outside the {n}-token vocabulary: {names}{f' ({harm(bad)})' if harm else ''}"
    return Finding("audit", check, "bug", title, ev, crit)
