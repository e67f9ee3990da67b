"""Character-level tokenizer: ``<pad>`` = 0, ``<unk>`` = 1 (as in the chapter's model), then the V most frequent
characters; :func:`encode_quiet` encodes with any tokenizer without its warnings."""

from __future__ import annotations

import hashlib
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any

PAD_ID = 0
UNK_ID = 1
PAD_TOKEN = "<pad>"
UNK_TOKEN = "<unk>"
SPECIALS = (PAD_TOKEN, UNK_TOKEN)


class UnknownCharactersWarning(UserWarning):
    """Emitted when encoded text contains characters outside the vocabulary."""


@dataclass
class EncodeResult:
    """Token ids plus the characters that had to become ``<unk>`` (in order of first appearance)."""

    ids: list[int]
    unknown_chars: list[str]
    unknown_positions: list[int]


class CharTokenizer:
    """Maps characters to ids; anything outside the top-V characters becomes ``<unk>``."""

    # The genprobe.model.load.Tokenizer protocol: a character vocabulary has no end-of-text token.
    kind = "char"
    unk_id = UNK_ID
    pad_id = PAD_ID
    eos_id = None

    def __init__(self, chars: list[str]):
        if len(set(chars)) != len(chars):
            raise ValueError("vocabulary characters must be unique")
        if bad := [c for c in chars if len(c) != 1]:
            raise ValueError(f"vocabulary entries must be single characters, got {bad[0]!r}")
        self.chars: list[str] = list(chars)
        self.itos: list[str] = list(SPECIALS) + self.chars
        self.stoi: dict[str, int] = {c: i + len(SPECIALS) for i, c in enumerate(self.chars)}

    @classmethod
    def from_text(cls, text: str, max_chars: int = 1200) -> "CharTokenizer":
        """Keep the ``max_chars`` most frequent characters of ``text`` (ties: first occurrence)."""
        if max_chars < 1:
            raise ValueError(f"max_chars must be >= 1, got {max_chars}")
        counts = Counter(text)
        return cls([c for c, _ in counts.most_common(max_chars)])

    @classmethod
    def from_itos(cls, itos: list[str]) -> "CharTokenizer":
        """Rebuild from a saved id→token list (specials first)."""
        if list(itos[: len(SPECIALS)]) != list(SPECIALS):
            raise ValueError(f"vocabulary must start with {SPECIALS}, got {itos[:2]}")
        return cls(list(itos[len(SPECIALS) :]))

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    @property
    def fingerprint(self) -> str:
        """sha256 of the id→token list; two tokenizers match iff fingerprints match."""
        return hashlib.sha256("\n".join(self.itos).encode("utf-8")).hexdigest()

    def coverage(self, text: str) -> dict:
        """Share of characters of ``text`` inside the vocabulary and the ``<unk>`` share of positions."""
        share = sum(c in self.stoi for c in text) / len(text) if text else 0.0
        return {"chars": len(text), "coverage": share, "unk_share": 1.0 - share if text else 0.0}

    def encode_with_report(self, text: str) -> EncodeResult:
        """Encode and report which characters became ``<unk>``."""
        ids = [self.stoi.get(c, UNK_ID) for c in text]
        positions = [i for i, t in enumerate(ids) if t == UNK_ID]
        return EncodeResult(ids, list(dict.fromkeys(text[i] for i in positions)), positions)

    def encode(self, text: str, warn: bool = True) -> list[int]:
        """Encode ``text``; warn (UnknownCharactersWarning) naming characters that became ``<unk>``."""
        res = self.encode_with_report(text)
        if warn and res.unknown_chars:
            warnings.warn(
                f"{len(res.unknown_positions)} character(s) of the prompt are not in the vocabulary "
                f"and encode to <unk>: {''.join(res.unknown_chars)!r} "
                f"(the corpus may use a different script, e.g. traditional vs simplified)",
                UnknownCharactersWarning,
                stacklevel=2,
            )
        return res.ids

    def decode(self, ids, show_unk: bool = False, unk_text: str = UNK_TOKEN) -> str:
        """Ids → text. ``<pad>`` is always dropped; ``<unk>`` is dropped unless ``show_unk``."""
        out = []
        for t in map(int, ids):
            if not 0 <= t < len(self.itos):
                raise ValueError(f"token id {t} outside vocabulary of size {len(self.itos)}")
            if t >= len(SPECIALS) or (t == UNK_ID and show_unk):
                out.append(unk_text if t == UNK_ID else self.itos[t])
        return "".join(out)

    def unknown_chars(self, text: str) -> list[str]:
        """Characters of ``text`` outside the vocabulary (each once, in order of first appearance)."""
        return self.encode_with_report(text).unknown_chars

    def token_str(self, t: int) -> str:
        """Display string of one id (specials as ``<pad>``/``<unk>``)."""
        return self.itos[int(t)]

    def to_dict(self) -> dict:
        return {"type": "char", "itos": self.itos, "pad_id": PAD_ID, "unk_id": UNK_ID}

    @classmethod
    def from_dict(cls, d: dict) -> "CharTokenizer":
        if d.get("type") != "char" or "itos" not in d:
            raise ValueError("not a genprobe char tokenizer description")
        return cls.from_itos(d["itos"])


def encode_quiet(tokenizer: Any, text: str) -> list[int]:
    """Encode without the char tokenizer's unknown-character warning (callers report coverage themselves) and
    without transformers' "longer than the maximum sequence length" notice (long texts are cut into windows)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return list(tokenizer.encode(text))
    finally:
        hf_logging.set_verbosity(level)
