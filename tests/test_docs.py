"""The README and docs/ stay short and runnable.

* README.md has at most 200 lines;
* every relative link in README.md and docs/*.md points at a file or directory that exists;
* every ``genprobe COMMAND [SUBCOMMAND] ...`` line of a fenced code block (or an inline code span that starts
  with ``genprobe ``) names a command, and a sub-command where the command has them, that the CLI's argparse
  parser knows, and every ``--flag`` on it is an option of that (sub-)command. The parser is inspected, never
  run;
* every ``scripts/X`` and ``benchmarks/X.py`` path named in code exists.
"""

from __future__ import annotations

import argparse
import fnmatch
import re
import shlex
from functools import cache
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
MAX_README_LINES = 200

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
REPO_PATH = re.compile(r"(?<![\w./-])(scripts/[\w.-]+(?:/[\w.-]+)*|benchmarks/[\w./-]*?\.py)(?![\w/-])")
PROGRAMS = ("genprobe", ".venv/bin/genprobe")
ALIAS = re.compile(r"(?<![\w$])([A-Za-z_]\w*)=(" + "|".join(map(re.escape, PROGRAMS)) + r")(?![\w./-])")
ENV_PREFIX = re.compile(r"^(?:[A-Za-z_]\w*=\S*\s+)+")
FLAG = re.compile(r"^--?[A-Za-z][\w*-]*$")
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")
MESSAGE = re.compile(r"^[\w-]+:(\s|$)")  # `genprobe verify-serving: error: ...` is output, not a command


# --- reading a page ------------------------------------------------------------------------------------------------
def split_page(text: str) -> tuple[list[list[tuple[int, str]]], list[tuple[int, str]]]:
    """(fenced code blocks as numbered lines, numbered lines outside them)."""
    blocks: list[list[tuple[int, str]]] = []
    prose: list[tuple[int, str]] = []
    block: list[tuple[int, str]] | None = None
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            if block is None:
                block = []
            else:
                blocks.append(block)
                block = None
        elif block is not None:
            block.append((number, line))
        else:
            prose.append((number, line))
    if block is not None:
        blocks.append(block)
    return blocks, prose


def logical_lines(block: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Shell lines with trailing-backslash continuations joined, numbered by their first line."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, line in block:
        if pending is not None:
            number, line = pending[0], pending[1] + " " + line.strip()
        if line.rstrip().endswith("\\"):
            pending = (number, line.rstrip()[:-1])
        else:
            pending = None
            out.append((number, line))
    if pending is not None:
        out.append(pending)
    return out


def inline_code(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Inline code spans of prose lines (a table's ``\\|`` read as ``|``)."""
    return [(n, m.group(2).replace("\\|", "|").strip()) for n, line in lines for m in INLINE_CODE.finditer(line)]


# --- the CLI --------------------------------------------------------------------------------------------------------
@cache
def cli_parser() -> argparse.ArgumentParser:
    from genprobe.cli import build_parser

    return build_parser()


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action._name_parser_map)
    return {}


def _flag_problem(flag: str, parser: argparse.ArgumentParser, where: str) -> str | None:
    name = flag.split("=", 1)[0]
    known = parser._option_string_actions
    if "*" in name:
        return None if fnmatch.filter(known, name) else f"no option of `{where}` matches {name}"
    if name not in known:
        return f"`{where}` has no option {name}"
    return None


def _words(command: str) -> list[str]:
    try:
        words = shlex.split(command, comments=True)
    except ValueError:  # an unbalanced quote in an illustrative line
        words = command.split("#", 1)[0].split()
    cleaned = []
    for word in words:
        if word in ("|", "||", "&&", ";", ">", "2>", "<") or word.startswith(("|", ">", "2>", ";")):
            break  # the rest of the line belongs to another program
        cleaned.append(word.strip("[]()").rstrip(";").removesuffix("..."))
    return cleaned


def command_problems(command: str) -> list[str]:
    """What is wrong with one ``genprobe ...`` command line (program name already removed)."""
    parser, where, problems = cli_parser(), "genprobe", []
    words = [w for w in _words(command) if w]
    at_command_level = True
    for word in words:
        if word.startswith("-") and FLAG.match(word.split("=", 1)[0]):
            problem = _flag_problem(word, parser, where)
            if problem:
                problems.append(problem)
            continue
        if not at_command_level:
            continue
        children = _subcommands(parser)
        if not children or PLACEHOLDER.match(word):  # `genprobe COMMAND [MODEL] [options]`: the grammar itself
            at_command_level = False
            continue
        names = word.split("|")
        unknown = [n for n in names if n not in children]
        if unknown:
            problems.append(f"`{where}` has no sub-command {' or '.join(unknown)} (known: {', '.join(children)})")
            return problems
        if len(names) > 1:  # `loops apply|revert MODEL ...`: each alternative must take the rest of the line
            rest = " ".join(shlex.quote(w) for w in words[words.index(word) + 1 :])
            prefix = " ".join(shlex.quote(w) for w in words[: words.index(word)])
            for name in names:
                problems += command_problems(f"{prefix} {name} {rest}")
            return sorted(set(problems))
        parser, where = children[word], f"{where} {word}"
    if at_command_level and _subcommands(parser) and where != "genprobe" and not _is_help(words):
        required = any(isinstance(a, argparse._SubParsersAction) and a.required for a in parser._actions)
        if required:
            problems.append(f"`{where}` needs a sub-command ({', '.join(_subcommands(parser))})")
    named = any(PLACEHOLDER.match(w) for w in words) or _is_help(words) or "--version" in words
    if where == "genprobe" and not named:
        problems.append("no command named")
    return problems


def _is_help(words: list[str]) -> bool:
    return "-h" in words or "--help" in words


def genprobe_invocation(line: str, aliases: set[str]) -> str | None:
    """The arguments of a line that runs genprobe (``$ `` prompt, ``VAR=x`` prefixes, ``$GP`` aliases), else None."""
    line = line.strip()
    line = line[2:].lstrip() if line.startswith("$ ") else line
    line = ENV_PREFIX.sub("", line)
    programs = [*PROGRAMS, *(f"${a}" for a in aliases), *(f"${{{a}}}" for a in aliases)]
    for program in programs:
        if line.startswith(program + " "):
            arguments = line[len(program) :].strip()
            return None if MESSAGE.match(arguments) else arguments
    return None


# --- the checks -----------------------------------------------------------------------------------------------------
def check_commands(text: str, inline: bool = True) -> list[str]:
    """Problems of every genprobe invocation in ``text``'s code blocks (and inline spans): ``line N: ...``."""
    blocks, prose = split_page(text)
    problems = []
    spans = [logical_lines(block) for block in blocks]
    if inline:
        spans.append(inline_code(prose))
    for lines in spans:
        aliases: set[str] = set()
        for number, line in lines:
            aliases |= {m.group(1) for m in ALIAS.finditer(line)}
            arguments = genprobe_invocation(line, aliases)
            if arguments is not None:
                problems += [f"line {number}: {p} in {line.strip()!r}" for p in command_problems(arguments)]
    return problems


def check_links(text: str, page: Path) -> list[str]:
    """Relative links of ``text`` (outside code) whose target does not exist next to ``page``."""
    _, prose = split_page(text)
    problems = []
    for number, line in prose:
        for match in LINK.finditer(INLINE_CODE.sub("", line)):
            target = match.group(1)
            if SCHEME.match(target) or target.startswith("#"):
                continue
            path = unquote(target.split("#", 1)[0].split("?", 1)[0])
            if path and not (page.parent / path).exists():
                problems.append(f"line {number}: link {target} does not exist")
    return problems


def check_paths(text: str) -> list[str]:
    """``scripts/...`` and ``benchmarks/....py`` paths named in code (blocks and inline spans) that do not exist."""
    blocks, prose = split_page(text)
    lines = [line for block in blocks for line in block] + inline_code(prose)
    return [
        f"line {number}: {path} does not exist"
        for number, line in lines
        for path in REPO_PATH.findall(line)
        if not (ROOT / path.rstrip(".")).exists()
    ]


# --- tests -----------------------------------------------------------------------------------------------------------
def _id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; results belong in docs/"


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_relative_links_exist(page):
    assert check_links(page.read_text(encoding="utf-8"), page) == []


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_commands_are_known_to_the_cli(page):
    assert check_commands(page.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_scripts_and_benchmarks_exist(page):
    assert check_paths(page.read_text(encoding="utf-8")) == []


def test_docs_index_lists_every_page():
    index = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    linked = {m.group(1).split("#", 1)[0] for m in LINK.finditer(index)}
    missing = [p.name for p in PAGES[1:] if p.name != "README.md" and p.name not in linked]
    assert missing == [], f"docs/README.md does not list {missing}"


PLANTED = """\
```bash
genprobe verify-cache out/case/model --mutants --compiled
genprobe verify-cahce out/case/model
genprobe loops scan out/case/model --backend vllm \\
    --no-such-flag 3
genprobe loops rescan out/case/model
$ genprobe attention heads MODEL --hf old
GP=genprobe
$GP generate MODEL --prompt hi --tempreature 0.8   # a typo
python benchmarks/no_such_benchmark.py --json
bash scripts/no_such_script.sh
```

And `genprobe loops apply|frobnicate MODEL PATCH --out DIR` inline; [a link](docs/no-such-page.md).
"""


def test_checkers_report_planted_mistakes():
    commands = check_commands(PLANTED)
    assert len(commands) == 6, commands
    assert "line 3: `genprobe` has no sub-command verify-cahce" in commands[0]
    assert "line 4: `genprobe loops scan` has no option --no-such-flag" in commands[1]
    assert "line 6: `genprobe loops` has no sub-command rescan" in commands[2]
    assert "line 7: `genprobe attention heads` has no option --hf" in commands[3]
    assert "line 9: `genprobe generate` has no option --tempreature" in commands[4]
    assert "line 14: `genprobe loops` has no sub-command frobnicate" in commands[5]
    assert [p.split(":")[0] for p in check_paths(PLANTED)] == ["line 10", "line 11"]
    assert check_links(PLANTED, README) == ["line 14: link docs/no-such-page.md does not exist"]


def test_checkers_accept_correct_commands():
    good = """\
```bash
genprobe verify-cache MODEL [--impl MOD:FACTORY] [--hf-cache all] [--window W --sinks S] [--json]
genprobe loops scan MODEL --backend vllm [--setting both|chanting] [--out DIR] \\
    [--tensor-parallel-size N]
.venv/bin/genprobe attention padding-leak MODEL --json | jq .
OMP_NUM_THREADS=1 genprobe fetch smollm2
genprobe --help
genprobe loops --help
```
"""
    assert check_commands(good) == []
