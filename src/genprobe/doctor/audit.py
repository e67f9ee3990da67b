"""The static audit stage: the model's files read as data, nothing executed (docs/doctor.md lists the checks). One
module per kind of file: :mod:`.gguf_audit`, :mod:`.hf_audit`; the checks both share (the chat template, hidden text,
special ids) in :mod:`.metadata_audit`. A directory converted from GGUF is audited as a transformers directory and,
when its GGUF file is still there, as that file too."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._io import NOT_JSON
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
