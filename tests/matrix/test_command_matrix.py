"""Every command that takes MODEL, on one tiny model of each kind (issue #50): it runs where the command takes the
kind and refuses in one line where it does not; a URL is refused as a URL everywhere; docs/commands.md's table is
the commands' own declarations. The vLLM rows are in test_command_matrix_vllm.py (the worker that owns vLLM)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from genprobe.cli.matrix import BEGIN, COLUMNS, END, matrix_markdown, model_kinds_of, with_matrix

from .command_cells import LLAMACPP_MISSING, build_matrix_models, cell_argv, check_cell, rows, run_cell, url_refused

REPO = Path(__file__).resolve().parents[2]
URL = "http://127.0.0.1:9/v1"  # nothing listens there: a URL must be refused before anything is asked of it
sys.path.insert(0, str(REPO / "tests" / "serving" / "llamacpp"))
from install_wait import llama_cpp_installed  # noqa: E402  (waits for the test command's install of the extra)


@pytest.fixture(scope="module")
def models(trained_ckpt, tmp_path_factory):
    return build_matrix_models(trained_ckpt, tmp_path_factory.mktemp("command-matrix"))


@pytest.mark.parametrize("kind", COLUMNS)
@pytest.mark.parametrize("row", rows(), ids=lambda r: r.label.replace(" ", "-"))
def test_cell(row, kind, models, capsys, monkeypatch):
    uses_llamacpp = row.backend == "llama.cpp" or row.command == ("quant-compare",)
    missing = uses_llamacpp and not llama_cpp_installed()
    rc, out, err = run_cell(cell_argv(row, kind, models, []), kind, models, capsys, monkeypatch)
    check_cell(row, kind, rc, out, err, engine_missing=LLAMACPP_MISSING if missing else None)


@pytest.mark.parametrize("row", model_kinds_of(), ids=lambda r: r.label.replace(" ", "-"))
def test_a_url_is_refused_as_a_url(row, models, capsys, monkeypatch):
    """Every command, with the options its cells run with: nothing is loaded or asked of the address."""
    rc, _, err = run_cell(cell_argv(row, "transformers", models, [], model=URL), "url", models, capsys, monkeypatch)
    url_refused(row, rc, err)


def test_the_loader_refuses_a_url_in_one_line():
    import genprobe

    with pytest.raises(ValueError, match=r"^http://host/v1 is a URL: live endpoints are not supported yet"):
        genprobe.load("http://host/v1")


def test_docs_carry_the_declared_matrix():
    doc = (REPO / "docs" / "commands.md").read_text(encoding="utf-8")
    assert BEGIN in doc and END in doc
    assert with_matrix(doc, matrix_markdown()) == doc, (
        "docs/commands.md's command matrix is out of date: run `python -m genprobe.cli.matrix --write docs/commands.md`"
    )


def test_every_command_with_model_is_a_row():
    """A command that takes MODEL without declaring its kinds would be missing from the matrix (and unchecked)."""
    import argparse

    from genprobe.cli import build_parser
    from genprobe.cli.matrix import _subcommands

    declared = {r.command for r in model_kinds_of()}
    for path, leaf in _subcommands(build_parser()):
        takes_model = any(a.dest == "model" for a in leaf._actions if not isinstance(a, argparse._HelpAction))
        assert takes_model == (path in declared), path
