"""Load the bundled Tang poems (or a user's text / JSONL) and split it 90/10 at the end."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

from .._io import read_jsonl, read_text

DEFAULT_POEMS = 4003
VAL_FRACTION = 0.1


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
        return {
            "source": self.source,
            "documents": len(self.documents),
            "chars": len(self.text),
            "train_chars": len(self.train),
            "val_chars": len(self.val),
        }


def read_documents(path: Path, limit: int | None = None) -> list[str]:
    """The documents of a JSONL(.xz) file whose lines are ``{"paragraphs": [...]}``, ``{"text": ...}`` or strings."""
    docs: list[str] = []
    for lineno, obj in read_jsonl(path, limit):
        if isinstance(obj, str):
            docs.append(obj)
        elif isinstance(obj, dict) and isinstance(obj.get("paragraphs"), list):
            docs.append("".join(str(p) for p in obj["paragraphs"]))
        elif isinstance(obj, dict) and isinstance(obj.get("text"), str):
            docs.append(obj["text"])
        else:
            raise ValueError(f"{path}: line {lineno} has neither a 'paragraphs' list nor a 'text' string")
    return docs


def load_corpus(path: str | Path | None = None, poems: int | None = DEFAULT_POEMS) -> Corpus:
    """Load the corpus: default = first 4,003 bundled poems, paragraphs concatenated, last 10% = validation.

    ``path`` may be a UTF-8 text file (one string) or a JSONL(.xz) file whose lines are
    ``{"paragraphs": [...]}``, ``{"text": ...}`` or bare strings; ``poems`` limits JSONL documents.
    """
    if poems is not None and poems < 1:
        raise ValueError(f"poems must be >= 1, got {poems}")
    p = bundled_corpus_path() if path is None else Path(path)
    if not p.exists():
        raise FileNotFoundError(f"corpus file not found: {p}")
    jsonl = p.name.endswith((".jsonl", ".jsonl.xz", ".json.xz"))
    docs = read_documents(p, poems) if jsonl else [read_text(p, "corpus")]
    text = "".join(docs)
    if len(text) < 20:
        raise ValueError(f"corpus {p} has only {len(text)} characters; need at least 20")
    cut = int(len(text) * (1.0 - VAL_FRACTION))
    source = "bundled:tang_poems" if path is None else str(p)
    return Corpus(text=text, train=text[:cut], val=text[cut:], source=source, documents=docs)


# ---- one split both reference models respect ----------------------------------------------------
# The char GPT trains on the first DEFAULT_POEMS poems and validates on the last 10% of their characters.
# The subword model trains on more of the file, so the split says, once, which poems each model may see:
#   [0, char_val_start)            training text of both models
#   [char_val_start, char_poems)   the char GPT's validation text: never trained on by the subword model
#   [char_poems, subword_poems)    subword-model training only
#   [heldout_start, documents)     held out from both: loop prompts and other unseen text come from here
DEFAULT_SUBWORD_POEMS = 50_000


@dataclass(frozen=True)
class CorpusSplit:
    """Document index ranges: what each reference model trains on, validates on, or never sees."""

    documents: int
    char_poems: int  # the char GPT's corpus is documents [0, char_poems)
    char_val_start: int  # first document holding characters of the char GPT's validation text
    char_val_offset: int  # character offset inside that document where the validation text starts
    subword_poems: int  # the subword model draws its training documents from [0, subword_poems)

    @property
    def char_val(self) -> range:
        """Documents (the first possibly partial) that make up the char GPT's validation text."""
        return range(self.char_val_start, self.char_poems)

    @property
    def subword_train(self) -> list[range]:
        """The subword model's training documents: the char GPT's training poems, then poems after its corpus."""
        head = range(0, min(self.subword_poems, self.char_val_start))
        return [head, range(self.char_poems, self.subword_poems)] if self.subword_poems > self.char_poems else [head]

    @property
    def heldout_start(self) -> int:
        """First held-out document: neither model trains or validates on anything from here on."""
        return max(self.subword_poems, self.char_poems)

    @property
    def heldout(self) -> range:
        """Held-out documents (loop prompts are drawn from these)."""
        return range(self.heldout_start, self.documents)

    def to_dict(self) -> dict:
        """Plain-data form for summaries: the fields, then the ranges as [start, stop)."""

        def span(r: range) -> list[int]:
            return [r.start, r.stop]

        train = [span(r) for r in self.subword_train]
        return asdict(self) | {"subword_train": train, "char_val": span(self.char_val), "heldout": span(self.heldout)}


def bundled_documents() -> list[str]:
    """All 57,607 bundled poems in file order (paragraphs concatenated, as :func:`load_corpus` reads them)."""
    return read_documents(bundled_corpus_path())


def corpus_split(
    documents: list[str], subword_poems: int = DEFAULT_SUBWORD_POEMS, char_poems: int = DEFAULT_POEMS
) -> CorpusSplit:
    """The split of ``documents``; the char GPT's validation cut is computed exactly as :func:`load_corpus` does."""
    n = len(documents)
    if n < 2:
        raise ValueError(f"a split needs at least 2 documents, got {n}")
    if char_poems < 1:
        raise ValueError(f"char_poems must be >= 1, got {char_poems}")
    if not 1 <= subword_poems < n:
        raise ValueError(
            f"subword_poems must be in [1, {n - 1}] (the corpus has {n} documents and at least one must "
            f"stay held out), got {subword_poems}"
        )
    char_poems = min(char_poems, n)
    char_chars = sum(len(d) for d in documents[:char_poems])
    cut = int(char_chars * (1.0 - VAL_FRACTION))  # same expression as load_corpus
    start, pos = 0, 0
    while start < char_poems and pos + len(documents[start]) <= cut:
        pos += len(documents[start])
        start += 1
    split = CorpusSplit(n, char_poems, start, cut - pos, subword_poems)
    if not any(len(r) for r in split.subword_train):
        raise ValueError(
            f"subword_poems={subword_poems} leaves no training documents before the char GPT's "
            f"validation text (it starts at document {start})"
        )
    return split


def reference_split(subword_poems: int = DEFAULT_SUBWORD_POEMS) -> CorpusSplit:
    """The split of the bundled corpus used by ``genprobe train`` (both architectures) and the loop prompts.

    Held-out prompts for either reference model: openings of poems from ``reference_split().heldout_start``
    on (50,000); everything before it is training or validation text of one of the two models.
    """
    return corpus_split(bundled_documents(), subword_poems)


@dataclass
class SplitTexts:
    """The texts behind a :class:`CorpusSplit`."""

    train: list[str]  # subword training documents (empty ones and exact copies of protected ones dropped)
    char_val_text: str  # the char GPT's validation text, identical to load_corpus(...).val
    char_val_documents: list[str]  # the same characters cut at document boundaries (the first is partial)
    heldout: list[str]
    duplicates_dropped: int  # training documents dropped because their text is a validation/held-out document


def split_texts(documents: list[str], split: CorpusSplit) -> SplitTexts:
    """Materialise ``split`` over ``documents``: training list, char-validation text, held-out list."""
    if len(documents) != split.documents:
        raise ValueError(f"split is for {split.documents} documents, got {len(documents)}")
    val_docs = [documents[i] for i in split.char_val]
    if val_docs:
        val_docs[0] = val_docs[0][split.char_val_offset :]
    heldout = [documents[i] for i in split.heldout]
    # The corpus records some poems twice: a copy in the training range would leak protected text.
    protected = {documents[i] for i in split.char_val} | set(heldout)
    candidates = [documents[i] for r in split.subword_train for i in r]
    train = [d for d in candidates if d and d not in protected]
    dropped = sum(1 for d in candidates if d and d in protected)
    return SplitTexts(train, "".join(val_docs), val_docs, heldout, dropped)
