"""verify-serving through llama.cpp on a tiny random Llama (F32 GGUF written by llama.cpp's converter): every phase
passes on F32 with an F32 KV cache; a prompt cache reused for a different prompt and a context shift by the wrong
distance are caught; a quantized file is judged on llama.cpp's own prefill with its gap to recomputation reported;
the command prints the table and exits by the verdicts.

Skipped with the reason (conftest) when llama.cpp's bindings are not installed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Sequence

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from models import tiny_llama_gguf  # noqa: E402

from genprobe._io import json_safe
from genprobe.serving.judge import NOT_CHECKED  # noqa: E402
from genprobe.serving.llamacpp.engine import LlamaCppModel  # noqa: E402
from genprobe.serving.llamacpp.verify import verify_serving_llamacpp  # noqa: E402
from genprobe.serving.verify import PHASES  # noqa: E402

# what llama.cpp in process cannot be asked: a per-request seed, chat, a per-step token budget, a cache block
UNCHECKED = {"diverge_inside", "chunked_prefill", "seed", "chat"}
LOGPROB_PHASES = {"prompt", "greedy", "batch", "prefix", "prefix_uncached", "diverge_boundary", "context_shift"}
CACHE_PHASES = ("prefix", "diverge_boundary")  # the prompt cache: a prompt sharing all but 4 tokens, and half


class StalePromptCacheModel(LlamaCppModel):
    """Planted fault: a prompt cache that trusts what it holds. Before each call it marks every cached token as
    matching the new prompt (as a cache keyed on length, or on a hash of only part of the prompt, would), so
    ``Llama.generate`` reuses the previous prompt's KV entries for a different prompt. verify-serving's prefix-cache
    phases must call this a bug."""

    def cached_prompt_logits(self, prompt_ids: Sequence[int]) -> tuple[np.ndarray, int]:
        """The fault, then the real call."""
        n = min(int(self.llama.n_tokens), len(prompt_ids))
        self.llama.input_ids[:n] = np.asarray(prompt_ids[:n], dtype=self.llama.input_ids.dtype)
        return super().cached_prompt_logits(prompt_ids)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(transformers directory, F32 GGUF) of the tiny Llama; built once per session."""
    torch.set_num_threads(1)
    return tiny_llama_gguf(tmp_path_factory.getbasetemp() / "llamacpp-tiny")


@pytest.fixture(scope="module")
def f32_report(tiny):
    return verify_serving_llamacpp(tiny[1], tiny[0], kv_type="f32", steps=8)


def _phase(report, name):
    return next(p for p in report.phases if p.phase == name)


def test_every_phase_passes_on_f32_and_is_judged_on_recomputation(f32_report):
    assert [p.phase for p in f32_report.phases] == [*PHASES, "context_shift"]
    assert {p.phase for p in f32_report.phases if p.verdict == NOT_CHECKED} == UNCHECKED
    for p in f32_report.phases:
        assert p.verdict in ("pass", NOT_CHECKED), (p.phase, p.max_abs_dlogp, p.note)
        assert p.dtype == "F32/kv-f32"
    for p in (p for p in f32_report.phases if p.phase in LOGPROB_PHASES):
        assert p.judged_on == "reference"
        assert p.positions > 0 and p.max_abs_dlogp < 1e-4 and p.top1_agreement == 1.0
    assert f32_report.verdict == "pass"
    assert f32_report.engines[0]["exact_arithmetic"] is True
    batch = _phase(f32_report, "batch")
    assert batch.requests == 8  # eight sequences in one context
    for name in CACHE_PHASES:
        p = _phase(f32_report, name)
        assert 0 < p.cached_tokens == p.shared_tokens  # the shared prefix, all of it and nothing more, was reused
    json.dumps(json_safe(f32_report), allow_nan=False)


def test_a_prompt_cache_reused_for_a_different_prompt_is_a_bug(tiny):
    with StalePromptCacheModel(tiny[1], n_ctx=64, kv_type="f32") as bad:
        report = verify_serving_llamacpp(tiny[1], tiny[0], engine=bad, steps=8)
    for name in CACHE_PHASES:
        p = _phase(report, name)
        assert p.verdict == "bug"
        assert p.cached_tokens > p.shared_tokens  # the reuse check saw it ...
        assert "reused for a different prompt" in p.note
        assert p.max_abs_dlogp > 1.0  # ... and so did the logits comparison, independently
    others = [p.verdict for p in report.phases if p.phase not in CACHE_PHASES and p.phase not in UNCHECKED]
    assert others == ["pass"] * len(others)  # the fault is where it was planted, nowhere else
    assert report.verdict == "bug"


def test_the_reuse_check_alone_catches_a_stale_cache_whose_logits_look_right():
    from genprobe.serving.verify import reuse_check

    # two prompts sharing 10 tokens: serving 11 from the cache is wrong even if the logits happened to agree
    assert reuse_check(11, 10, 1) is not None
    assert reuse_check(10, 10, 1) is None  # exactly the shared prefix: allowed
    assert reuse_check(0, 10, 1) is None


class _DiscardsTheWrongTokens(LlamaCppModel):
    """A context shift with an off-by-one discard window: it keeps token n_keep and drops one more after the window
    (positions stay consistent, so llama.cpp accepts every later decode: only the logits can tell)."""

    def remove(self, p0: int, p1: int, seq_id: int = 0) -> None:
        super().remove(p0 + 1, p1 + 1, seq_id)

    def shift(self, p0: int, p1: int, delta: int, seq_id: int = 0) -> None:
        super().shift(p0 + 1, p1, delta, seq_id)


class _ShiftsTooFar(LlamaCppModel):
    """A context shift one position too far: positions collide, and llama.cpp refuses the next decode."""

    def shift(self, p0: int, p1: int, delta: int, seq_id: int = 0) -> None:
        super().shift(p0, p1, delta - 1, seq_id)


def test_context_shift_equals_the_float32_shift_and_a_wrong_shift_is_caught(tiny, f32_report):
    good = _phase(f32_report, "context_shift")
    assert good.verdict == "pass" and good.max_abs_dlogp < 1e-4
    # full recomputation of the kept tokens is NOT what a shift computes (the kept K/V saw the discarded tokens)
    assert good.self_max_abs_dlogp > 1e-3
    # one token of 130 wrong moves log p by ~0.03 here: beyond float noise, so at least suspicious (exit 1 with
    # --fail-on suspicious); a shift llama.cpp itself cannot continue after is a bug
    for mutant, verdicts in ((_DiscardsTheWrongTokens, ("suspicious", "bug")), (_ShiftsTooFar, ("bug",))):
        with mutant(tiny[1], n_ctx=64, kv_type="f32") as bad:
            report = verify_serving_llamacpp(tiny[1], tiny[0], engine=bad, steps=8)
        shifted = _phase(report, "context_shift")
        assert shifted.verdict in verdicts, (mutant.__name__, shifted.max_abs_dlogp, shifted.note)
        others = [p.verdict for p in report.phases if p.phase != "context_shift" and p.phase not in UNCHECKED]
        assert others == ["pass"] * len(others)


def test_a_quantized_file_is_judged_on_its_gap_ratio_and_a_stale_cache_still_caught(tiny, tmp_path):
    from genprobe.serving.llamacpp.quantize import quantize_gguf

    q8 = quantize_gguf(tiny[1], tmp_path / "tiny-Q8_0.gguf", "Q8_0").path
    report = verify_serving_llamacpp(q8, steps=8)  # the reference: the Q8_0 weights dequantized
    assert report.engines[0]["exact_arithmetic"] is False
    prefill = _phase(report, "prompt")
    # activations quantized to Q8_0 and K/V to F16: more than float noise away from the dequantized weights'
    # float32 recomputation; that gap is the yardstick (its own floor: ratio 1), not a verdict
    assert prefill.max_abs_dlogp > 1e-4 and prefill.judged_on == "gap" and prefill.verdict == "pass"
    assert prefill.gap_ratio == pytest.approx(1.0)
    for p in report.phases:
        assert p.dtype == "Q8_0/kv-f16"
        if p.phase in LOGPROB_PHASES:
            assert p.judged_on == "gap" and p.verdict == "pass" and 0 < p.gap_ratio <= 2.0, (p.phase, p.gap_ratio)
    with StalePromptCacheModel(q8, n_ctx=64) as bad:
        stale = verify_serving_llamacpp(q8, engine=bad, steps=8)
    for name in CACHE_PHASES:
        assert _phase(stale, name).verdict == "bug"
    # half the prompt served from the wrong prompt's cache: the logits alone exceed the quantization noise
    assert _phase(stale, "diverge_boundary").gap_ratio > 5.0


def _judged(exact, served_shift, floor_shift, floor=True):
    """One request judged by the verifier's Judge on whole rows: the served rows ``served_shift`` above the
    reference's (its gap), the floor computation ``floor_shift`` above them (the floor's gap)."""
    from genprobe.engine.backend import Response
    from genprobe.serving.judge import Judge
    from genprobe.verify.compare import Thresholds

    ref = -torch.arange(8, dtype=torch.float64).repeat(3, 1)  # exact in binary: every shift below is exact too
    honest = (lambda ids: ref + floor_shift) if floor else None
    judge = Judge(lambda ids: ref, Thresholds(), 5, floor=honest, exact=exact)
    return judge.phase("p", [Response([0, 1], [2], [], "length", rows=ref[:2] + served_shift)])


def test_gap_ratio_thresholds_at_their_exact_edges():
    from genprobe.serving.judge import GAP_BUG, GAP_PASS

    floor = 2.0**-7
    verdicts = [_judged(False, floor * r, floor).verdict for r in (GAP_PASS, GAP_PASS * 1.01, GAP_BUG, GAP_BUG * 1.01)]
    assert verdicts == ["pass", "suspicious", "suspicious", "bug"]
    assert _judged(False, float("inf"), floor).verdict == "bug"
    assert _judged(False, 2.0**-17, 0.0).verdict == "pass"  # no floor at all: the ratio's floor is the noise
    assert _judged(False, 3.0, 3.0).gap_ratio == 1.0  # the floor computation itself: the yardstick
    # exact arithmetic: verify-cache's scale on max |Δ log p|, whatever the gap statistic says
    got = _judged(True, 2.0**-12, 2.0**-12)
    assert (got.verdict, got.judged_on) == ("small", "reference") and got.gap_ratio is None


def test_the_command_prints_every_phase_and_exits_by_the_verdicts(tiny, capsys):
    from genprobe.cli import main

    argv = ["verify-serving", str(tiny[1]), "--backend", "llama.cpp", "--reference", str(tiny[0])]
    rc = main([*argv, "--kv-type", "f32", "--max-new-tokens", "8", "--json"])
    out = capsys.readouterr()
    data = json.loads(out.out)
    assert rc == 0 and data["exit_status"] == 0 and data["verdict"] == "pass"
    assert [p["phase"] for p in data["phases"]] == [*PHASES, "context_shift"]
    assert "context_shift" in out.err and "judged on f32" in out.err
