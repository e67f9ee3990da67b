"""Which command takes which kind of MODEL: read off the parser's own declarations, so that docs/commands.md's table
and ``tests/cli/test_command_matrix.py`` (which runs every cell) come from one source and cannot disagree.

``python -m genprobe.cli.matrix --write docs/commands.md`` rewrites the table between its two markers.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from . import build_parser
from ._common import MODEL_KINDS

BEGIN = "<!-- command-matrix:begin (written by `python -m genprobe.cli.matrix --write docs/commands.md`) -->"
END = "<!-- command-matrix:end -->"
COLUMNS = MODEL_KINDS  # the kinds of MODEL on disk, in the table's column order
HEADINGS = ("genprobe checkpoint", "transformers directory", "GGUF file", "fetched name (`smollm2`)")
#: The table's columns: the model kinds, and a live endpoint's URL (its cells: tests/matrix's URL test)
TABLE_COLUMNS = (*COLUMNS, "url")
TABLE_HEADINGS = (*HEADINGS, "URL (live server)")


@dataclass(frozen=True)
class Row:
    """One command (with one ``--backend`` where the kinds depend on it) and the kinds of MODEL it takes."""

    command: tuple[str, ...]  # ("loops", "scan")
    backend: str | None
    kinds: tuple[str, ...]

    @property
    def label(self) -> str:
        """The command words and the backend flag, as typed before MODEL's options: ``loops scan --backend vllm``."""
        return " ".join([*self.command, *(["--backend", self.backend] if self.backend else [])])


def _subcommands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
    for action in subs:
        for name, child in action.choices.items():
            yield from _subcommands(child, (*path, name))


def model_kinds_of(parser: argparse.ArgumentParser | None = None) -> list[Row]:
    """Every command that takes MODEL, one row per backend where its kinds depend on the backend, in command order."""
    rows = []
    for path, leaf in _subcommands(parser or build_parser()):
        kinds = leaf._defaults.get("model_kinds")
        if kinds is None:
            continue
        if isinstance(kinds, dict):
            rows += [Row(path, backend, tuple(k)) for backend, k in kinds.items()]
        else:
            rows.append(Row(path, None, tuple(kinds)))
    return sorted(rows, key=lambda r: (r.command, r.backend or ""))


def matrix_markdown(rows: list[Row] | None = None) -> str:
    """The table: a row per command, a column per kind, ✓ where it runs and "refused" where it says which it takes."""
    lines = ["| command | " + " | ".join(TABLE_HEADINGS) + " |", "|---|" + "---|" * len(TABLE_COLUMNS)]
    for row in rows if rows is not None else model_kinds_of():
        cells = ["✓" if kind in row.kinds else "refused" for kind in TABLE_COLUMNS]
        lines.append(f"| `{row.label}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def with_matrix(doc: str, table: str) -> str:
    """``doc`` with the text between the markers replaced by ``table`` (a ValueError when a marker is missing)."""
    if BEGIN not in doc or END not in doc:
        raise ValueError("the document has no command-matrix markers")
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    """``--write FILE``: rewrite the table in FILE; no argument: print it."""
    args = argv if argv is not None else sys.argv[1:]
    if len(args) == 2 and args[0] == "--write":
        from .._io import atomic_write_text

        path = Path(args[1])
        atomic_write_text(path, with_matrix(path.read_text(encoding="utf-8"), matrix_markdown()))
        return 0
    print(matrix_markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
