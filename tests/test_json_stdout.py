"""Issue #29: under ``--json`` stdout holds the JSON alone, even when vLLM or a native library writes to fd 1.

``genprobe._io.json_stdout()`` points fd 1 (and ``sys.stdout``) at stderr while active and yields a stream on the
real stdout; the CLI's ``--json`` path and every benchmark with ``--json`` run inside it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)


def test_json_stdout_sends_fd1_writes_to_stderr_and_json_to_stdout():
    code = """
import json, os, sys, ctypes
from genprobe._io import json_stdout
print("before", flush=True)
with json_stdout() as out:
    os.write(1, b"noise\\n")                 # what a native library or vLLM's workers do
    print("py-noise")                         # a stray print
    ctypes.CDLL(None).printf(b"c-noise\\n")  # C stdio, buffered when stdout is a pipe
    print(json.dumps({"ok": 1}), file=out)
print("after", flush=True)
"""
    r = _run(code)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "before" and lines[-1] == "after"
    assert json.loads("\n".join(lines[1:-1])) == {"ok": 1}
    for noise in ("noise", "py-noise", "c-noise"):
        assert noise in r.stderr.splitlines()


def test_json_stdout_disabled_changes_nothing():
    r = _run(
        "import os, sys\nfrom genprobe._io import json_stdout\n"
        "with json_stdout(False) as out:\n    assert out is sys.stdout\n    os.write(1, b'plain\\n')\n"
    )
    assert r.returncode == 0 and r.stdout == "plain\n" and r.stderr == ""


def test_cli_json_path_keeps_stdout_json_only():
    """A command that prints to fd 1 (as vLLM does) still leaves exactly one JSON document on stdout."""
    code = """
import dataclasses, os, sys
import genprobe.cli.cmd_convert_gguf as cmd
from genprobe.cli import main
from genprobe.cli._common import emit_json

def noisy(args):
    os.write(1, b"noise\\n")
    print("py-noise")
    emit_json({"out": str(args.out)})
    return 0

cmd.COMMANDS = (dataclasses.replace(cmd.COMMANDS[0], run=noisy),)
sys.exit(main(["convert-gguf", "x.gguf", "--out", "d", "--json"]))
"""
    r = _run(code)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"out": "d"}
    assert "noise" in r.stderr and "py-noise" in r.stderr


@pytest.mark.parametrize(
    "name",
    [
        "generate_speed",
        "hf_path_speed",
        "llama_profile",
        "loop_monitor",
        "loop_scan_throughput",
        "loop_served_repair",
        "sampler_overhead",
        "weight_only_quality",
    ],
)
def test_every_benchmark_with_json_runs_inside_json_stdout(name):
    src = (REPO / "benchmarks" / f"{name}.py").read_text(encoding="utf-8")
    assert '"--json"' in src
    assert re.search(r"with json_stdout\(.*--json.*\) as \w+:\n\s+return _main\(", src), name
    assert "sys.stdout, indent" not in src and "print(json.dumps(out, indent=2))\n" not in src


def test_the_benchmark_list_is_complete():
    """Every benchmark that takes --json for its own output is in the list above."""
    with_json = {
        p.stem
        for p in (REPO / "benchmarks").glob("*.py")
        if re.search(r"add_argument\(\s*\"--json\"", p.read_text(encoding="utf-8"))
    }
    assert with_json == {
        "generate_speed",
        "hf_path_speed",
        "llama_profile",
        "loop_monitor",
        "loop_scan_throughput",
        "loop_served_repair",
        "sampler_overhead",
        "weight_only_quality",
    }
