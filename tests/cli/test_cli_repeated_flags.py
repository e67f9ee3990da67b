"""Issue #29: a repeated flag is never silently dropped, and ``--out`` is a directory everywhere.

List flags accumulate (``--prompt A --prompt B`` is ``--prompt A B``; the first use replaces the default, it never
extends it); ``--ids``, one sequence's token ids, is refused when given twice. Every ``--out`` is a directory
(``loops scan`` writes ``scan.json`` into it, ``loops locate`` ``locate.json``), and a file there is refused.
"""

from __future__ import annotations

import argparse

import pytest

from genprobe.cli import build_parser, main
from genprobe.cli._common import Accumulate, Once


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield " ".join(path), parser
        return
    for name, sub in subs[0]._name_parser_map.items():
        yield from _leaves(sub, (*path, name))


LEAVES = dict(_leaves(build_parser()))


def _parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


@pytest.mark.parametrize(
    "argv, dest, expected",
    [
        (["generate", "M", "--prompt", "A", "--prompt", "B"], "prompt", ["A", "B"]),
        (["generate", "M", "--prompt", "A", "B", "--prompt", "C"], "prompt", ["A", "B", "C"]),
        (["loops", "scan", "M", "--prompt", "A", "--prompt", "B"], "prompt", ["A", "B"]),
        (["verify-cache", "M", "--prompt", "A", "--prompt", "B"], "prompt", ["A", "B"]),
        (["verify-cache", "M", "--chunk-sizes", "2", "--chunk-sizes", "3"], "chunk_sizes", ["2", "3"]),
        (["verify-cache", "M", "--hf-cache", "static", "--hf-cache", "dynamic"], "hf_cache", ["static", "dynamic"]),
        (["loops", "repair", "M", "--out", "d", "--ks", "2", "--ks", "8"], "ks", [2, 8]),
        (
            ["loops", "compare", "M", "--out", "d", "--methods", "greedy", "--methods", "dry"],
            "methods",
            ["greedy", "dry"],
        ),
        (
            ["case", "--out", "d", "--skip", "cache_timing", "--skip", "cache_scaling"],
            "skip",
            ["cache_timing", "cache_scaling"],
        ),
        (["phenomena", "M", "--timing-batches", "1", "--timing-batches", "4"], "timing_batches", [1, 4]),
        (["attention", "heads", "M", "--out", "d", "--maps", "0", "--maps", "1"], "maps", [0, 1]),
        (["attention", "heads", "M", "--out", "d", "--maps", "0", "--maps"], "maps", []),  # no LAYER: every layer
    ],
)
def test_a_repeated_list_flag_accumulates(argv, dest, expected):
    assert getattr(_parse(*argv), dest) == expected


def test_the_first_use_replaces_the_default_and_the_default_is_not_mutated():
    d = _parse("loops", "repair", "M", "--out", "d")
    assert d.ks and d.ks != [5]
    assert _parse("loops", "repair", "M", "--out", "d", "--ks", "5").ks == [5]
    assert _parse("loops", "repair", "M", "--out", "d").ks == d.ks  # a fresh parse sees the untouched default
    assert _parse("verify-cache", "M", "--chunk-sizes", "2").chunk_sizes == ["2"]


@pytest.mark.parametrize("command", [["attention", "heads", "M"], ["attention", "padding-leak", "M"]])
def test_ids_of_one_sequence_given_twice_are_refused(command, capsys):
    with pytest.raises(SystemExit) as exc:
        _parse(*command, "--ids", "1", "2", "--ids", "3")
    assert exc.value.code == 2
    assert "--ids given twice" in capsys.readouterr().err


def test_every_list_flag_of_every_command_accumulates_or_refuses_a_repeat():
    """A new ``nargs="+"`` flag with the default store action would keep only its last use: caught here."""
    plain = [
        f"{name} {'/'.join(a.option_strings)}"
        for name, p in LEAVES.items()
        for a in p._actions
        if a.option_strings and a.nargs in ("+", "*") and not isinstance(a, (Accumulate, Once, argparse._AppendAction))
    ]
    assert plain == []
    assert sum(isinstance(a, Accumulate) for p in LEAVES.values() for a in p._actions) >= 20


def test_every_out_is_a_directory():
    outs = {name: a for name, p in LEAVES.items() for a in p._actions if "--out" in a.option_strings}
    assert {"loops scan", "loops locate", "loops repair", "case", "phenomena"} <= set(outs)
    assert {name: a.metavar for name, a in outs.items() if a.metavar != "DIR"} == {}
    assert "scan.json" in outs["loops scan"].help and "locate.json" in outs["loops locate"].help


@pytest.mark.parametrize("action", ["scan", "locate"])
def test_loops_out_naming_a_file_is_refused_before_any_work(action, tmp_path, capsys):
    f = tmp_path / "scan.json"
    f.write_text("{}", encoding="utf-8")
    # the model does not exist: the --out check comes first, so nothing is loaded or generated
    assert main(["loops", action, str(tmp_path / "no-model"), "--prompt", "a", "--out", str(f)]) == 2
    err = capsys.readouterr().err
    assert f"--out {f} exists and is not a directory" in err
    assert f.read_text(encoding="utf-8") == "{}"
