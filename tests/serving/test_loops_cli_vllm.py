"""``genprobe loops scan --backend vllm``: our engine's greedy loop verdicts and JSON, through the CLI.

Reference: ``genprobe loops scan --backend genprobe`` (``genprobe.loops.scan.engine_batches`` on the same
weights in float32). The vLLM run uses the engine options of the other serving tests, so the process's
shared engine is reused, not restarted.
"""

from __future__ import annotations

import json

import pytest

from genprobe.cli import build_parser, main
from genprobe.cli._vllm_args import engine_options as cli_engine_options

NEW = 57  # the repair setting: 5-character openings + 57 new tokens = the 64-token context minus 2


def _scan(model, out, backend: str, flags: list[str], *extra: str) -> dict:
    argv = [
        "loops",
        "scan",
        str(model),
        "--tang-prompts",
        "--n",
        "32",
        "--max-new-tokens",
        str(NEW),
        "--batch-size",
        "16",
        "--backend",
        backend,
        "--out",
        str(out),
        "--no-progress",
        *extra,
    ]
    if backend == "vllm":
        argv += flags
    assert main(argv) == 0
    return json.loads((out / "scan.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def both(vllm_ready, served_dirs, scan_engine_flags, tmp_path_factory):
    """(our engine's --out JSON, vLLM's --out JSON) of `loops scan` on the patched model, both settings."""
    d = tmp_path_factory.mktemp("cli-scan")
    ours = _scan(served_dirs["patched"], d / "ours", "genprobe", scan_engine_flags)
    theirs = _scan(served_dirs["patched"], d / "vllm", "vllm", scan_engine_flags)
    return ours, theirs


def test_scan_flags_reproduce_the_shared_engine(scan_engine_flags, engine_options):
    """Otherwise the CLI test would start (and the next test restart) an engine: tens of seconds each."""
    args = build_parser().parse_args(["loops", "scan", "M", "--backend", "vllm", *scan_engine_flags])
    assert cli_engine_options(args, seed=args.seed) == engine_options("float32")


def test_cli_vllm_scan_gives_our_engine_verdicts_and_json(both):
    ours, theirs = both
    assert (ours["backend"], theirs["backend"]) == ("genprobe", "vllm")
    assert set(theirs) == set(ours) | {"vllm"}  # the same JSON, plus the engine's description
    assert set(ours["scans"]) == set(theirs["scans"]) == {"chanting", "greedy"}
    for name in ("chanting", "greedy"):
        a, b = ours["scans"][name], theirs["scans"][name]
        assert a["settings"] == b["settings"] and a["summary"] == b["summary"]
        verdicts = [
            [(r["looping"], r["period"], r["onset"], r["near_looping"], r["repetitive"]) for r in s["records"]]
            for s in (a, b)
        ]
        assert verdicts[0] == verdicts[1]
    loops = [r["looping"] for r in ours["scans"]["chanting"]["records"]]
    assert 0 < sum(loops) < len(loops)  # both outcomes occur: the comparison is not vacuous
    assert theirs["vllm"]["options"]["dtype"] == "float32"


def test_a_sampler_vllm_cannot_express_is_refused_by_name(vllm_ready, served_dirs, scan_engine_flags, capsys):
    base = [
        "loops",
        "scan",
        str(served_dirs["patched"]),
        "--tang-prompts",
        "--n",
        "2",
        "--backend",
        "vllm",
        "--setting",
        "sample",
        *scan_engine_flags,
    ]
    assert main([*base, "--no-repeat-ngram", "3"]) == 2
    assert "no_repeat_ngram" in capsys.readouterr().err
    assert main([*base, "--temperature", "0.8"]) == 2  # genprobe's arithmetic for τ: not vLLM's
    assert "--preset vllm" in capsys.readouterr().err
