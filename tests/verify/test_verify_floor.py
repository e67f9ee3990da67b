"""Noise-floor-aware verdicts: the reference's own float noise is measured and a difference is judged against it.

The fake reference below is exact except for a deterministic wobble of ``EPS`` on every logit of a
forward over an odd number of positions: the same logits computed over two lengths differ by EPS,
which is exactly what summation order does to a deep float32 model (SmolLM2-135M: ~1e-3). A correct
cache then differs from that reference by up to EPS, and a cache off by 2x the floor must still pass,
while one far above it must not.
"""

from __future__ import annotations

import json

import pytest

from genprobe.verify.adapters import EngineAdapter, FullRecompute
from genprobe.verify.compare import Thresholds
from genprobe.verify.harness import ReferenceRun, VerifyOptions, verify_implementation

EPS = 1e-3
PROMPTS = [[3, 7, 11, 5, 9, 2, 8], [4, 6, 10]]


class WobblyReference(FullRecompute):
    """Full recomputation plus EPS on every logit when the forward covers an odd number of positions."""

    def full(self, ids, attention_mask=None):
        out = super().full(ids, attention_mask)
        return out + EPS if ids.shape[1] % 2 else out


class Offset(EngineAdapter):
    """The engine with every decode step's logits moved by ``delta``."""

    def __init__(self, model, delta):
        super().__init__(model)
        self.delta = delta

    def step(self, ids):
        return super().step(ids) + self.delta


def run(model, delta, **kw):
    opts = VerifyOptions(**{"max_new_tokens": 6, "prefix_reuse": False, **kw})
    return verify_implementation(Offset(model, delta), WobblyReference(model), PROMPTS, opts)


def test_the_floor_is_measured_from_the_reference_alone(long_model):
    floor = ReferenceRun(WobblyReference(long_model), 6).noise_floor(PROMPTS)
    assert floor["value"] == pytest.approx(EPS, rel=1e-3)
    assert set(floor["sources"]) == {"prefix_vs_whole", "batched_vs_solo"}
    exact = ReferenceRun(FullRecompute(long_model), 6).noise_floor(PROMPTS)
    assert exact["value"] < 1e-5  # our 2-layer reference: reproducible to a few ulps


def test_twice_the_floor_passes_far_above_it_does_not(long_model):
    ok = run(long_model, 2 * EPS)  # |Δ| up to 3 EPS < 4 x floor
    assert ok.verdict == "pass", ok.max_abs_dlogit_by_phase
    assert ok.noise_floor["value"] == pytest.approx(EPS, rel=1e-3) and ok.pass_line == pytest.approx(4 * EPS, rel=1e-3)
    far = run(long_model, 100 * EPS)
    assert far.verdict == "suspicious" and far.max_abs_dlogit > 0.09


def test_the_verdict_uses_the_floor(long_model):
    """The same 2x-floor difference, judged without the floor, is not a pass: the floor is what lets it through."""
    assert run(long_model, 2 * EPS, noise_floor=False).verdict == "suspicious"
    assert run(long_model, 2 * EPS, thresholds=Thresholds(floor_multiple=0.0)).verdict == "suspicious"
    assert run(long_model, 0.0).verdict == "pass"  # a correct cache against a noisy reference


def test_pass_line_multiple_and_cap():
    th = Thresholds()
    assert th.pass_line(None) == th.noise == th.pass_line(0.0) == th.pass_line(float("nan"))
    assert th.pass_line(1e-6) == 1e-4  # a floor below the absolute noise changes nothing
    assert th.pass_line(1e-3) == pytest.approx(4e-3)
    assert th.pass_line(10.0) == pytest.approx(0.1)  # capped at 0.1 x bug: a noisy reference never hides a bug
    assert th.verdict(3e-3, ref_std=1.0, floor=1e-3) == "pass"
    assert th.verdict(5e-3, ref_std=1.0, floor=1e-3) == "suspicious"
    assert th.verdict(2.0, ref_std=1.0, floor=10.0) == "bug"
    assert th.bug_margin(3.0, ref_std=0.5) == pytest.approx(6.0) and th.bug_margin(float("nan")) == float("inf")
    with pytest.raises(ValueError, match="floor_multiple"):
        Thresholds(floor_multiple=-1.0)


def test_floor_and_pass_line_in_the_json(capsys, tiny_ckpt):
    from genprobe.cli import main

    rc = main(["verify-cache", str(tiny_ckpt), "--max-new-tokens", "4", "--floor-multiple", "8", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["thresholds"]["floor_multiple"] == 8.0
    impl = d["implementations"][0]
    assert set(impl["noise_floor"]["sources"]) == {"prefix_vs_whole", "batched_vs_solo"}
    assert d["noise_floor"] == impl["noise_floor"] and d["pass_line"] == impl["pass_line"] >= 1e-4
    assert impl["bug_margin"] < 1e-3 and impl["reuse"]
