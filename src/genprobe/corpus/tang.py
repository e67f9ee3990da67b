"""Load the bundled Tang poems (or a user's text / JSONL) and split it 90/10 at the end."""

from __future__ import annotations

import json
import lzma
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

DEFAULT_POEMS = 4003
DEFAULT_VAL_FRACTION = 0.1


def bundled_corpus_path() -> Path:
    """Path of the vendored ``tang_poems.jsonl.xz`` (57,607 poems, traditional characters)."""
    return Path(str(resources.files("genprobe.corpus") / "data" / "tang_poems.jsonl.xz"))


@dataclass
class Corpus:
    """A text corpus as one string plus its end-of-text validation split."""

    text: str
    train: str
    val: str
    source: str
    documents: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        """Plain-data description for reports."""
        return {
            "source": self.source,
            "documents": len(self.documents),
            "chars": len(self.text),
            "train_chars": len(self.train),
            "val_chars": len(self.val),
        }


def _read_jsonl(path: Path, limit: int | None) -> list[str]:
    opener = lzma.open if path.suffix == ".xz" else open
    docs: list[str] = []
    with opener(path, "rt", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if limit is not None and len(docs) >= limit:
                break
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}: line {lineno} is not valid JSON ({exc.msg})") from None
            if isinstance(obj, str):
                docs.append(obj)
            elif isinstance(obj, dict) and isinstance(obj.get("paragraphs"), list):
                docs.append("".join(str(p) for p in obj["paragraphs"]))
            elif isinstance(obj, dict) and isinstance(obj.get("text"), str):
                docs.append(obj["text"])
            else:
                raise ValueError(
                    f"{path}: line {lineno} has neither a 'paragraphs' list nor a 'text' string"
                )
    return docs


def load_corpus(
    path: str | Path | None = None,
    poems: int | None = DEFAULT_POEMS,
    val_fraction: float = DEFAULT_VAL_FRACTION,
) -> Corpus:
    """Load the corpus: default = first 4,003 bundled poems, paragraphs concatenated, last 10% = validation.

    ``path`` may be a UTF-8 text file (one string) or a JSONL(.xz) file whose lines are
    ``{"paragraphs": [...]}``, ``{"text": ...}`` or bare strings; ``poems`` limits JSONL documents.
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    if poems is not None and poems < 1:
        raise ValueError(f"poems must be >= 1, got {poems}")
    p = bundled_corpus_path() if path is None else Path(path)
    if not p.exists():
        raise FileNotFoundError(f"corpus file not found: {p}")
    name = p.name
    if name.endswith(".jsonl") or name.endswith(".jsonl.xz") or name.endswith(".json.xz"):
        docs = _read_jsonl(p, poems)
    else:
        try:
            docs = [p.read_text(encoding="utf-8")]
        except UnicodeDecodeError as exc:
            raise ValueError(f"{p} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    text = "".join(docs)
    if len(text) < 20:
        raise ValueError(f"corpus {p} has only {len(text)} characters; need at least 20")
    cut = int(len(text) * (1.0 - val_fraction))
    source = "bundled:tang_poems" if path is None else str(p)
    return Corpus(text=text, train=text[:cut], val=text[cut:], source=source, documents=docs)
