"""What a MODEL argument names: a genprobe checkpoint, a ``transformers`` directory, a GGUF file, a catalog name —
or a URL, which no command takes yet.

Every command that takes MODEL declares the kinds it accepts (``genprobe.cli._common.add_model_argument``) and
refuses the others with one line that names the kind it was given and the kinds it takes, before anything loads.
The kind is read off the file system alone (names of files, never their contents), so the check costs nothing.
"""

from __future__ import annotations

import os
import re
from enum import Enum
from pathlib import Path


class ModelKind(str, Enum):
    """The kinds of thing a MODEL argument can name (the values are what the CLI's declarations spell)."""

    CHECKPOINT = "checkpoint"
    TRANSFORMERS = "transformers"
    GGUF = "gguf"
    NAME = "name"
    URL = "url"

    @property
    def phrase(self) -> str:
        """The kind with an article, as a sentence uses it."""
        return {
            "checkpoint": "a genprobe checkpoint",
            "transformers": "a transformers directory",
            "gguf": "a GGUF file",
            "name": "a fetched model's name",
            "url": "a URL",
        }[self.value]


#: The kinds a model loaded from disk can be (every command's default).
FILE_KINDS = (ModelKind.CHECKPOINT, ModelKind.TRANSFORMERS, ModelKind.GGUF, ModelKind.NAME)

# RFC 3986 scheme followed by "//": http://host/v1, https://…, also unix:// or grpc:// — never a local path
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(arg: str | os.PathLike[str]) -> bool:
    """Whether ``arg`` is written as a URL (``pathlib`` would read ``http://host/v1`` as the path ``http:/host/v1``)."""
    return isinstance(arg, str) and _URL.match(arg) is not None


def model_kind(arg: str | os.PathLike[str]) -> ModelKind | None:
    """The kind of thing ``arg`` names, or None when it names nothing that exists (the loader then says so).

    A directory with ``genprobe.json`` is a checkpoint, one with ``config.json`` a transformers directory, a
    ``.gguf`` file (or a directory holding ``.gguf`` files and no ``config.json``) a GGUF file; a name that is not a
    path is a catalog name when the catalog knows it, fetched or not.
    """
    from .catalog import CATALOG

    if is_url(arg):
        return ModelKind.URL
    path = Path(arg)
    if not path.exists():
        return ModelKind.NAME if str(arg) in CATALOG else None
    if path.is_file():
        return ModelKind.GGUF if path.suffix.lower() == ".gguf" else None
    if (path / "genprobe.json").is_file():
        return ModelKind.CHECKPOINT
    if (path / "config.json").is_file():
        return ModelKind.TRANSFORMERS
    if any(path.glob("*.gguf")):
        return ModelKind.GGUF
    return None


def kinds_phrase(kinds: tuple[ModelKind, ...]) -> str:
    """``a genprobe checkpoint, a transformers directory or a GGUF file``."""
    words = [k.phrase for k in kinds]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def kind_refusal(command: str, arg: str | os.PathLike[str], kinds: tuple[str, ...]) -> str | None:
    """The one-line refusal of ``arg`` by ``command`` (which takes ``kinds``, :class:`ModelKind` values), or None
    when it takes it. Something that does not exist is left to the loader, whose error says what was looked for."""
    taken = tuple(ModelKind(k) for k in kinds)
    kind = model_kind(arg)
    if kind is None or kind in taken:
        return None
    if kind is ModelKind.URL:
        return f"{arg} is a URL: live endpoints are not supported yet; genprobe {command} takes {kinds_phrase(taken)}"
    hint = ""
    if kind is ModelKind.GGUF and ModelKind.TRANSFORMERS in taken:
        hint = f" (convert it once: genprobe convert-gguf {arg} --out DIR)"
    return f"genprobe {command} takes {kinds_phrase(taken)}; {arg} is {kind.phrase}{hint}"
