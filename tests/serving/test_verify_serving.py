"""verify-serving: a float32 deployment passes every phase, a deployment serving other weights is a bug,
bfloat16 is suspicious (not pass). The bfloat16 test runs last: it replaces the shared float32 engine.

Reference: float32 recomputation of the same tokens with transformers (``genprobe.serving.compare``).
"""

from __future__ import annotations

import json

import pytest

from genprobe.serving.verify import PHASES, build_workload, verify_serving


def test_workload_shapes_exercise_each_feature():
    """Long prompts exceed the token budget (chunked), the prefix fills a block, the batch mixes lengths."""
    w = build_workload(room=48, budget=32, vocab=100, seed=1)
    assert all(32 < len(p) <= 48 for p in w.long) and w.long
    assert len(set(map(len, w.batch))) >= 6 and max(map(len, w.batch)) == 48
    assert w.prefix_first[:-4] == w.prefix_second[:-4] and w.prefix_first != w.prefix_second
    assert build_workload(room=48, budget=64, vocab=100).long == []  # nothing to chunk: the phase is skipped
    with pytest.raises(ValueError, match="room"):
        build_workload(room=3, budget=32, vocab=100)


def test_float32_deployment_passes_every_phase(vllm_ready, served_dirs, engine_options):
    rep = verify_serving(served_dirs["patched"], dtypes=("float32",), options=engine_options("float32"))
    assert [p.phase for p in rep.phases] == list(PHASES)
    for p in rep.phases:
        assert p.verdict == "pass" and p.top1_agreement == 1.0 and p.max_abs_dlogp < 1e-4, p
        assert p.positions > 0 and p.first_divergence is None
    by = {p.phase: p for p in rep.phases}
    assert by["prefix_cached"].cached_tokens >= 32 and by["prefix_uncached"].cached_tokens == 0
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
    alone = next(p for p in out["phases"] if p["phase"] == "alone")
    assert alone["max_abs_dlogp"] > 1.0 and alone["first_divergence"] is not None
    assert out["failing"]


def test_bfloat16_deployment_is_suspicious_not_pass(vllm_ready, served_dirs, engine_flags, capsys):
    from genprobe.cli import main

    rc = main(["verify-serving", str(served_dirs["patched"]), "--dtypes", "bfloat16", "--json", *engine_flags])
    cap = capsys.readouterr()
    text = cap.out
    assert text.startswith("{"), (
        rc,
        text[:500],
        cap.err[-3000:],
    )  # stdout holds the JSON only (vLLM's logs and bars go elsewhere)
    out = json.loads(text)
    assert out["verdict_by_dtype"] == {"bfloat16": "suspicious"}, [
        (p["phase"], p["max_abs_dlogp"]) for p in out["phases"]
    ]
    assert rc == 0  # --fail-on bug (the default): suspicious is reported, not failed
    assert all(1e-3 <= p["max_abs_dlogp"] <= 1.0 for p in out["phases"] if not p["skipped"])
