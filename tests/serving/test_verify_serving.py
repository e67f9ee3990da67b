"""verify-serving: a float32 deployment passes every phase, a deployment serving other weights is a bug,
bfloat16 is suspicious (not pass). The bfloat16 test runs last: it replaces the shared float32 engine.

Reference: float32 recomputation of the same tokens with transformers (``genprobe.serving.judge``).
"""

from __future__ import annotations

import json

import pytest

from genprobe.serving.judge import NOT_CHECKED
from genprobe.serving.verify import (
    PHASES,
    build_workload,
    divergence_points,
    diverging_request,
    reuse_check,
    verify_serving,
)


def test_workload_shapes_exercise_each_feature():
    """Long prompts exceed the token budget (chunked), the prefix fills a block, the batch mixes lengths."""
    w = build_workload(room=48, budget=32, vocab=100, seed=1)
    assert all(32 < len(p) <= 48 for p in w.long) and w.long
    assert len(set(map(len, w.batch))) >= 6 and max(map(len, w.batch)) == 48
    assert w.prefix[0][:-4] == w.prefix[1][:-4] and w.prefix[0] != w.prefix[1]
    assert build_workload(room=48, budget=64, vocab=100).long == []  # nothing to chunk: the phase is skipped
    with pytest.raises(ValueError, match="room"):
        build_workload(room=3, budget=32, vocab=100)


def test_divergence_points_fall_at_a_boundary_and_inside_a_block():
    """vLLM's CPU block is 16 (and 128 where the GPU default is used): a boundary, then half a block past it."""
    assert divergence_points(60, 16) == {"diverge_boundary": 16, "diverge_inside": 24}
    assert divergence_points(120, 16) == {"diverge_boundary": 48, "diverge_inside": 56}
    assert divergence_points(17, 16) == {}  # not two tokens after one block: nothing to diverge in
    assert divergence_points(19, 16) == {"diverge_boundary": 16, "diverge_inside": 8}  # inside the first block
    assert divergence_points(48, 32) == {"diverge_boundary": 32, "diverge_inside": 16}  # the tests' engine
    for n, b in [(40, 8), (200, 16), (1000, 128)]:
        for shared in divergence_points(n, b).values():
            assert shared <= n - 2
    req = diverging_request([5, 6, 7, 8, 3], 2, vocab=9)
    assert req[:2] == (5, 6) and all(a != b for a, b in zip(req[2:], [7, 8, 3], strict=True)) and len(req) == 5
    assert req[3] == 0  # wraps inside the vocabulary


@pytest.mark.parametrize(
    ("cached", "shared", "block", "wrong"),
    [
        (16, 24, 16, False),  # the whole shared block, not the half-shared one: correct
        (0, 24, 16, False),  # no reuse is slow, not wrong
        (16, 16, 16, False),  # exactly at the boundary
        (32, 24, 16, True),  # the half-shared block served too: a hash over part of the block
        (32, 31, 16, True),  # one token short of the block's end (the stale-tail bug)
        (17, 16, 16, True),
    ],
)
def test_reuse_beyond_the_shared_prefix_is_a_bug(cached, shared, block, wrong):
    why = reuse_check(cached, shared, block)
    assert (why is not None) == wrong
    if wrong:
        assert str(cached) in why and str(shared) in why


def test_float32_deployment_passes_every_phase(vllm_ready, served_dirs, engine_options):
    rep = verify_serving(served_dirs["patched"], dtypes=("float32",), options=engine_options("float32"))
    assert [p.phase for p in rep.phases] == list(PHASES)
    by = {p.phase: p for p in rep.phases}
    # the in-process engine has no tokenizer (no text for a stop string) and no chat template here
    unchecked = {p.phase for p in rep.phases if p.verdict == NOT_CHECKED}
    assert unchecked == {"chat"}, [(p.phase, p.note) for p in rep.phases]
    assert by["seed"].verdict == by["limits"].verdict == "pass"
    for p in (p for p in rep.phases if p.judged_on == "reference"):
        assert p.verdict == "pass" and p.top1_agreement == 1.0 and p.max_abs_dlogp < 1e-4, p
        assert p.positions > 0 and p.first_divergence is None
    assert {p.phase for p in rep.phases if p.judged_on == "reference"} == set(PHASES) - {"seed", "limits", "chat"}
    assert by["prefix"].cached_tokens >= 32 and by["prefix_uncached"].cached_tokens == 0
    for name in ("diverge_boundary", "diverge_inside"):  # whole shared blocks served, the half-shared one not
        d = by[name]
        bs = rep.engines[0]["block_size"]
        assert d.shared_tokens and d.cached_tokens == d.shared_tokens // bs * bs, (d, bs)
    assert by["diverge_boundary"].cached_tokens > 0  # whole blocks were shared, and served
    assert by["chunked_prefill"].prefill_chunks >= 2
    assert rep.verdict == "pass"


def test_serving_other_weights_is_a_bug_and_exits_1(vllm_ready, served_dirs, engine_flags, capsys):
    """The deployment serves the patched weights where the unpatched ones are expected (--reference)."""
    from genprobe.cli import main

    rc = main(
        [
            "verify-serving",
            str(served_dirs["patched"]),
            "--reference",
            str(served_dirs["base"]),
            "--dtypes",
            "float32",
            "--prompt",
            "春江潮水連海平",
            "--json",
            *engine_flags,
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and out["exit_status"] == 1 and out["verdict"] == "bug"
    alone = next(p for p in out["phases"] if p["phase"] == "greedy")
    assert alone["max_abs_dlogp"] > 1.0 and alone["first_divergence"] is not None
    assert out["failing"]


def _bfloat16_cli(model, engine_flags, capsys, *extra: str) -> tuple[int, dict]:
    from genprobe.cli import main

    rc = main(["verify-serving", str(model), "--dtypes", "bfloat16", "--json", *engine_flags, *extra])
    cap = capsys.readouterr()
    assert cap.out.startswith("{"), (rc, cap.out[:500], cap.err[-3000:])  # stdout holds the JSON only
    return rc, json.loads(cap.out)


def test_an_honest_bfloat16_deployment_passes_on_its_gap_ratio(vllm_ready, served_dirs, engine_flags, capsys):
    """Reduced precision is not a bug (issue #51): judged on its gap to float32 over the same model's in bfloat16;
    the float32 distances, which verify-cache's scale would call suspicious, are reported beside it."""
    rc, out = _bfloat16_cli(served_dirs["patched"], engine_flags, capsys)
    ran = [p for p in out["phases"] if p["judged_on"] not in ("", "tokens")]  # the phases that read log-probs
    assert rc == 0 and out["verdict_by_dtype"] == {"bfloat16": "pass"}, [(p["phase"], p["gap_ratio"]) for p in ran]
    for p in ran:
        assert p["judged_on"] == "gap" and p["gap_ratio"] <= 2.0 and p["floor"] > 1e-4, p
    assert max(p["max_abs_dlogp"] for p in ran) >= 1e-3  # bfloat16 is visible in the float32 distances


@pytest.mark.parametrize(
    ("served", "reference"),
    [("patched", "base"), ("shifted", "patched")],  # the honest test's engine first: reused, not restarted
    ids=["other-weights", "positions-shifted-by-one"],
)
def test_a_fault_in_a_bfloat16_deployment_is_a_bug_with_margin(
    vllm_ready, served_dirs, engine_flags, capsys, served, reference
):
    """A planted fault is not drowned in bfloat16's noise: every phase a bug, 3× past the bug line, exit 1."""
    from genprobe.serving.judge import GAP_BUG

    rc, out = _bfloat16_cli(served_dirs[served], engine_flags, capsys, "--reference", str(served_dirs[reference]))
    ran = [p for p in out["phases"] if p["judged_on"] == "gap"]
    assert rc == 1 and out["verdict"] == "bug" and "bfloat16/greedy" in out["failing"]
    margins = {p["phase"]: p["gap_ratio"] / GAP_BUG for p in ran}
    assert min(margins.values()) >= 3.0, margins


def test_engine_output_goes_to_the_log_file_and_progress_to_the_terminal(tmp_path):
    """What an engine prints (Python's stdout/stderr, logging, native writes to fds 1 and 2) lands in the log."""
    import subprocess
    import sys

    script = (
        "import logging, os, sys\n"
        "from genprobe._io import output_to_file\n"
        "handler = logging.StreamHandler(sys.stdout)\n"
        "logging.getLogger('engine').addHandler(handler)\n"
        f"with output_to_file({str(tmp_path / 'engine.log')!r}) as terminal:\n"
        "    print('engine stdout'); print('engine stderr', file=sys.stderr)\n"
        "    logging.getLogger('engine').warning('engine logger')\n"
        "    os.write(1, b'native fd1\\n'); os.write(2, b'native fd2\\n')\n"
        "    print('progress', file=terminal)\n"
        "print('after')\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    log = (tmp_path / "engine.log").read_text()
    for line in ("engine stdout", "engine stderr", "engine logger", "native fd1", "native fd2"):
        assert line in log and line not in run.stdout + run.stderr, line
    assert run.stderr.strip() == "progress" and run.stdout.strip() == "after"
