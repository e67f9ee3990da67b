"""The vLLM rows of the command matrix (``verify-serving`` and ``loops scan --backend vllm`` on every kind), on the
worker that owns vLLM (tests/conftest.py XDIST_GROUPS), and the regression of issue #50: ``loops scan CKPT --backend
vllm`` on a genprobe checkpoint (vLLM sized on the checkpoint's export) gives our engine's greedy verdicts.

Engines are keyed by (source, options): the cells of one model pass the same engine flags, so each model starts one
engine (the checkpoint's, the tiny Llama's — the catalog name resolves to it); the options are what the serving tests
use (``tests/serving/conftest.py``)."""

from __future__ import annotations

import json

import pytest

from genprobe.cli.matrix import COLUMNS

from .command_cells import build_matrix_models, cell_argv, check_cell, rows, run_cell

# tests/serving/conftest.py's ENGINE_FLAGS and scan_engine_flags: in-process vLLM, an explicit 64 MiB KV cache and
# verify-serving's scheduler defaults spelled out, so a scan and a verification start the same engine
ENGINE = ["--in-process", "--kv-cache-memory-bytes", str(64 << 20)]
SCHEDULER = ["--max-num-batched-tokens", "32", "--max-num-seqs", "32", "--block-size", "32"]
# The checkpoint's context (64) is what both commands size to; the Llama's 128 is given, as a scan sizes it lower
CONTEXT = {"checkpoint": [], "transformers": ["--max-model-len", "128"], "name": ["--max-model-len", "128"]}
SCAN_NEW = {"checkpoint": "57"}  # 5 + 57 tokens round up to the checkpoint's whole context: the same engine options


def _vllm_problem() -> str | None:
    from genprobe.serving.engine import vllm_import_problem

    return vllm_import_problem()


@pytest.fixture(scope="module")
def models(trained_ckpt, tmp_path_factory):
    return build_matrix_models(trained_ckpt, tmp_path_factory.mktemp("command-matrix-vllm"))


def _flags(row, kind: str) -> list[str]:
    flags = [*ENGINE, *SCHEDULER, *CONTEXT.get(kind, [])]
    if row.command == ("loops", "scan"):
        flags += ["--max-new-tokens", SCAN_NEW.get(kind, "16")]
    return flags


def _scan(model: str, out, backend: str) -> dict:
    from genprobe.cli import main

    argv = ["loops", "scan", model, "--tang-prompts", "--n", "32", "--max-new-tokens", "57", "--batch-size", "16"]
    argv += ["--backend", backend, "--out", str(out), "--no-progress"]
    assert main(argv + ([*ENGINE, *SCHEDULER] if backend == "vllm" else [])) == 0
    return json.loads((out / "scan.json").read_text(encoding="utf-8"))


def test_vllm_scan_of_a_checkpoint_gives_our_engine_verdicts(models, tmp_path):
    """Issue #50: the scan backend sized vLLM on the checkpoint's own directory (no config.json) and refused it.
    (First in the file: the checkpoint cells below reuse its engine.)"""
    assert _vllm_problem() is None, "vLLM is part of the test extras (scripts/setup.sh --test)"
    ckpt = models.args["checkpoint"]
    ours, theirs = _scan(ckpt, tmp_path / "ours", "genprobe"), _scan(ckpt, tmp_path / "vllm", "vllm")
    assert theirs["vllm"]["model"]["kind"] == "genprobe"  # served from the checkpoint's export
    for name in ("chanting", "greedy"):
        a, b = ours["scans"][name], theirs["scans"][name]
        verdicts = [[(r["looping"], r["period"], r["onset"], r["near_looping"]) for r in s["records"]] for s in (a, b)]
        assert len(verdicts[0]) == 32
        assert verdicts[0] == verdicts[1], name
        assert a["summary"] == b["summary"], name
    loops = [r["looping"] for r in ours["scans"]["chanting"]["records"]]
    assert 0 < sum(loops) < len(loops)  # both outcomes occur: agreement is not vacuous


# the row varies fastest: one model's cells one after the other, on its one engine
@pytest.mark.parametrize("row", rows("vllm"), ids=lambda r: r.label.replace(" ", "-"))
@pytest.mark.parametrize("kind", COLUMNS)
def test_cell(row, kind, models, capsys, monkeypatch):
    problem = _vllm_problem()
    rc, out, err = run_cell(cell_argv(row, kind, models, _flags(row, kind)), kind, models, capsys, monkeypatch)
    check_cell(row, kind, rc, out, err, engine_missing="vLLM" if problem else None)
