"""One CLI grammar: walk every sub-command's parser and check the shared concepts are spelled one way.

``genprobe COMMAND [MODEL] [options]``: MODEL is the first positional of every command that studies a model; the
token budget is ``--max-new-tokens``, prompts ``--prompt TEXT...``/``--prompts FILE``, and ``--seed``, ``--json``,
``--out`` mean the same thing everywhere. There is no second (old) spelling of any of them.
"""

from __future__ import annotations

import argparse

import pytest

from genprobe.cli import build_parser

# train/longrange build their own model; fetch names a catalog entry; check-masks reads BATCH.jsonl
NO_MODEL = {"train", "longrange", "attention check-masks", "fetch"}
# concept → the one spelling, and spellings that must not exist
CANONICAL = {
    "--max-new-tokens": ("--new-tokens", "--tokens", "--n-tokens", "--num-tokens", "--gen-tokens"),
    "--prompt": ("--text", "--prompt-text"),
    "--seed": ("--random-seed", "--rng-seed"),
    "--out": ("--output", "--out-dir", "--output-dir", "-o"),
    "--json": ("--as-json", "--json-out"),
}
MODEL_FLAGS = ("--ckpt", "--hf", "--model", "--checkpoint")


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield " ".join(path), parser
        return
    for name, sub in subs[0]._name_parser_map.items():
        yield from _leaves(sub, (*path, name))


LEAVES = dict(_leaves(build_parser()))


def _visible(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: a for a in parser._actions if a.help != argparse.SUPPRESS for s in a.option_strings}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


def test_the_walk_reaches_every_command():
    assert {
        "generate",
        "verify-cache",
        "case",
        "attention heads",
        "attention padding-leak",
        "loops scan",
        "loops repair",
        "loops compare",
        "loops apply",
        "loops revert",
        "train",
    } <= set(LEAVES)


@pytest.mark.parametrize("path", sorted(LEAVES))
def test_model_is_the_first_positional(path):
    positionals = [a for a in LEAVES[path]._actions if not a.option_strings]
    if path in NO_MODEL:
        assert all(a.dest != "model" for a in positionals)
        return
    assert positionals and positionals[0].dest == "model", f"{path}: first positional is not MODEL"
    assert not set(MODEL_FLAGS) & _options(LEAVES[path]), f"{path}: a flag names the model"


@pytest.mark.parametrize("path", sorted(LEAVES))
def test_one_spelling_per_concept(path):
    options = _options(LEAVES[path])
    for canonical, others in CANONICAL.items():
        for other in others:
            assert other not in options, f"{path}: {other} exists (the spelling is {canonical})"
    if path != "train":  # train's --steps are optimiser steps, a different concept
        assert "--steps" not in options, f"{path}: --steps for a token budget (the spelling is --max-new-tokens)"
    hidden = {s for a in LEAVES[path]._actions if a.help == argparse.SUPPRESS for s in a.option_strings}
    assert not hidden, f"{path}: hidden options {sorted(hidden)}"


def _shape(action: argparse.Action) -> tuple:
    return type(action).__name__, action.nargs, getattr(action.type, "__name__", action.type), action.metavar


@pytest.mark.parametrize("flag", ["--max-new-tokens", "--prompt", "--prompts", "--seed", "--json"])
def test_a_shared_flag_has_one_shape_everywhere(flag):
    """Same name → same arity, type and metavar (``--prompt TEXT [TEXT ...]`` everywhere, not a comma string)."""
    shapes = {path: _shape(_visible(p)[flag]) for path, p in LEAVES.items() if flag in _visible(p)}
    assert len(shapes) >= 2, flag
    assert len(set(shapes.values())) == 1, shapes


def test_no_comma_separated_lists():
    for path, parser in LEAVES.items():
        for action in parser._actions:
            if action.help not in (None, argparse.SUPPRESS):
                assert "comma" not in action.help.lower(), f"{path} {action.option_strings}: lists are nargs"


@pytest.mark.parametrize(
    "argv",
    [
        ["verify-cache", "--steps", "5"],
        ["verify-cache", "--model", "m"],
        ["loops", "scan", "--ckpt", "m"],
        ["loops", "scan", "m", "--new-tokens", "5"],
        ["case", "--ckpt", "m", "--out", "o"],
        ["attention", "m"],
        ["attention", "heads", "--hf", "m"],
        ["attention", "padding-leak", "m", "--text", "x"],
    ],
)
def test_old_spellings_are_gone(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2 and "error:" in capsys.readouterr().err


def test_version_flag(capsys):
    import genprobe

    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["--version"])
    assert exc.value.code == 0 and genprobe.__version__ in capsys.readouterr().out
