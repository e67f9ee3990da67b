"""The harness tested against planted faults: each comparison it makes has a fault only it can see.

Every fault wraps the (correct) engine and corrupts one kind of call, chosen so that exactly one
phase of the harness makes that call. Deleting that comparison from the harness turns the matching
test red. The isolation phase replays the prompt's greedy run after another sequence, so these
faults would show there too: it is off here, and its own fault — state that survives ``reset()`` —
is tested in test_verify_isolation.py. So are the prefix-reuse phases (their prefills and steps would
see the prefill and step faults too; their own faults are in test_verify_reuse.py).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from genprobe._io import json_safe
from genprobe.verify.adapters import EngineAdapter, FullRecompute
from genprobe.verify.compare import Thresholds
from genprobe.verify.harness import ReferenceRun, VerifyOptions, verify_implementation
from genprobe.verify.report import max_abs_diff

STEPS = 6


class Faulty(EngineAdapter):
    """The engine with a hook that may rewrite the logits of a call."""

    def __init__(self, model, fault):
        super().__init__(model)
        self.fault = fault
        self.prefill_len = 0
        self.calls = 0  # step() calls since reset

    def reset(self):
        super().reset()
        self.calls = 0

    def prefill(self, ids, attention_mask=None):
        self.prefill_len, self.calls = ids.shape[1], 0
        out = super().prefill(ids, attention_mask)
        return self.fault(self, "prefill", ids, attention_mask, out)

    def step(self, ids):
        self.calls += 1
        out = super().step(ids)
        return self.fault(self, "step", ids, None, out)


def run(model, prompt, fault, **kw):
    opts = VerifyOptions(**{"max_new_tokens": STEPS, "isolation": False, "prefix_reuse": False, **kw})
    return verify_implementation(Faulty(model, fault), FullRecompute(model), [prompt], opts)


def only_phase(report, phase, above=1.0):
    """The named phase is the only one above ``above``; all others are float noise."""
    for p in report.phases:
        if p.phase == phase:
            assert p.max_abs_dlogit > above, report.max_abs_dlogit_by_phase
        else:
            assert p.skipped or p.max_abs_dlogit < 1e-4, report.max_abs_dlogit_by_phase


def test_clean_wrapper_passes(sharp_model, prompt):
    r = run(sharp_model, prompt, lambda s, kind, ids, mask, out: out)
    assert r.verdict == "pass" and r.prefill_bit_identical


# ---- one fault per comparison ------------------------------------------------------------------------
def test_prefill_comparison(sharp_model, prompt):
    # an unpadded prefill longer than any chunk corrupts an early prompt position (not the last one,
    # so no decode step and no greedy token sees it)
    def fault(s, kind, ids, mask, out):
        if kind == "prefill" and mask is None and ids.shape[1] > 4:
            out = out.clone()
            out[:, 0] += 5.0
        return out

    r = run(sharp_model, prompt, fault)
    only_phase(r, "prefill")
    assert r.verdict == "bug" and r.first_diff_step == 0 and r.text_divergences == 0
    assert not r.text_only_would_catch


def test_prefill_bit_identity_is_checked_exactly(sharp_model, prompt):
    # a last-bit difference: far below noise, but not the same code path (seed §3.4.9: torch.equal)
    def fault(s, kind, ids, mask, out):
        if kind == "prefill" and mask is None and ids.shape[1] > 4:
            out = out.clone()
            out[:, 0, 0] = torch.nextafter(out[:, 0, 0], torch.tensor(math.inf))
        return out

    r = run(sharp_model, prompt, fault)
    assert not r.prefill_bit_identical and r.phase("prefill").first_any_diff_step == 0
    assert r.verdict == "pass" and r.first_any_diff_step == 0 and r.first_diff_step is None
    strict = run(sharp_model, prompt, fault, thresholds=Thresholds(exact_prefill=True))
    assert strict.verdict == "small"


def test_incremental_comparison(sharp_model, prompt):
    # single-token steps after a real prompt are shifted by a constant: argmax (text) unchanged
    def fault(s, kind, ids, mask, out):
        return out + 3.0 if kind == "step" and ids.shape == (1, 1) and s.prefill_len > 4 and s.calls >= 4 else out

    r = run(sharp_model, prompt, fault)
    only_phase(r, "incremental")
    assert r.first_diff_step == 4 and r.phase("incremental").first_diff_step == 4
    assert r.verdict == "bug" and r.text_divergences == 0 and not r.text_only_would_catch


@pytest.mark.parametrize("chunk", [1, 4])
def test_chunked_comparison(sharp_model, prompt, chunk):
    # chunk 1: a one-token prefill; chunk 4: multi-token steps — calls no other phase makes
    def fault(s, kind, ids, mask, out):
        hit = (kind == "prefill" and ids.shape[1] == 1) if chunk == 1 else (kind == "step" and ids.shape[1] > 1)
        return out + 3.0 if hit else out

    r = run(sharp_model, prompt, fault)
    only_phase(r, f"chunk_{chunk}")
    assert r.verdict == "bug" and r.first_diff_step is None  # the greedy run itself is clean


def test_padded_batch_comparison(sharp_model, prompt):
    def fault(s, kind, ids, mask, out):
        return out + 3.0 if kind == "prefill" and mask is not None and not bool(mask.bool().all()) else out

    r = run(sharp_model, prompt, fault)
    only_phase(r, "padded_batch")
    assert r.verdict == "bug"
    off = run(sharp_model, prompt, fault, padded_batch=False)
    assert off.verdict == "pass" and "padded_batch" not in off.max_abs_dlogit_by_phase


def test_padded_batch_decode_steps_are_compared(sharp_model, prompt):
    def fault(s, kind, ids, mask, out):
        return out + 3.0 if kind == "step" and ids.shape[0] > 1 else out

    only_phase(run(sharp_model, prompt, fault), "padded_batch")


def test_text_divergence_count(sharp_model, prompt):
    # at the 3rd decode step the top-2 logits are swapped: a text change the count must see
    def fault(s, kind, ids, mask, out):
        if kind == "step" and s.calls == 3 and ids.shape[0] == 1 and s.prefill_len > 4:
            out = out.clone()
            top2 = out[0, -1].topk(2).indices
            out[0, -1, top2] = out[0, -1, top2.flip(0)]
        return out

    r = run(sharp_model, prompt, fault)
    assert r.first_text_divergence == 3 and r.text_divergences >= 1 and r.text_only_would_catch
    t = r.texts[0]
    assert t["implementation"][:3] == t["reference"][:3] and t["implementation"][3] != t["reference"][3]
    assert r.text_tokens == STEPS + 1


@pytest.mark.parametrize(
    "offset, verdict",
    [(0.0, "pass"), (3e-5, "pass"), (5e-4, "small"), (0.05, "suspicious"), (0.9, "suspicious"), (2.0, "bug")],
)
def test_verdict_scale(sharp_model, prompt, offset, verdict):
    r = run(sharp_model, prompt, lambda s, kind, ids, mask, out: out + offset if kind == "step" else out)
    assert r.verdict == verdict, r.max_abs_dlogit


def test_thresholds_are_configurable(sharp_model, prompt):
    fault = lambda s, kind, ids, mask, out: out + 0.05 if kind == "step" else out  # noqa: E731
    assert run(sharp_model, prompt, fault, thresholds=Thresholds(noise=0.1, bug=1.0, suspicious=0.5)).verdict == "pass"
    strict = Thresholds(noise=1e-4, bug=0.01, suspicious=1e-3)
    assert run(sharp_model, prompt, fault, thresholds=strict).verdict == "bug"


def test_first_any_vs_first_above_noise(sharp_model, prompt):
    def fault(s, kind, ids, mask, out):
        if kind == "step" and ids.shape == (1, 1) and s.prefill_len > 4:
            return out + (1e-6 if s.calls == 2 else 2.0 if s.calls == 5 else 0.0)
        return out

    r = run(sharp_model, prompt, fault)
    assert r.first_any_diff_step <= 2 and r.first_diff_step == 5


def test_nan_logits_are_a_bug(sharp_model, prompt):
    r = run(sharp_model, prompt, lambda s, kind, ids, mask, out: out * float("nan") if kind == "step" else out)
    assert r.verdict == "bug" and math.isinf(r.max_abs_dlogit)


# ---- pieces -----------------------------------------------------------------------------------------
def test_thresholds_validation_and_boundaries():
    th = Thresholds()
    assert [th.verdict(x) for x in (0.0, 9.99e-5, 1e-4, 1e-3, 1.0, 1.0001)] == [
        "pass",
        "pass",
        "small",
        "suspicious",
        "suspicious",
        "bug",
    ]
    assert th.verdict(float("nan")) == "bug"
    with pytest.raises(ValueError, match="noise <= suspicious <= bug"):
        Thresholds(noise=1.0, bug=0.1)
    with pytest.raises(ValueError, match="rel_suspicious <= rel_bug"):
        Thresholds(rel_suspicious=2.0, rel_bug=1.0)


def test_relative_scale_raises_verdicts_only_above_the_noise_floor():
    th = Thresholds()
    # Δ 0.6 where the reference logits spread by 0.16: suspicious on the seed's scale, 3.75 σ → bug
    assert th.absolute_verdict(0.6) == "suspicious" and th.verdict(0.6, ref_std=0.16) == "bug"
    assert th.verdict(0.6, ref_std=3.0) == "suspicious"  # 0.2 σ on a trained-scale model
    assert th.verdict(5e-4, ref_std=1e-3) == "suspicious"  # 0.5 σ of tiny logits
    # float noise stays "pass" however small the logits: the relative scale starts at the absolute floor
    assert th.verdict(5e-5, ref_std=1e-6) == "pass" and th.verdict(5e-5, ref_std=0.0) == "pass"
    assert th.verdict(2e-4, ref_std=0.0) == "bug"  # constant reference logits, an above-noise change
    assert th.verdict(float("nan"), ref_std=1.0) == "bug"
    # the relative scale never lowers the seed's verdict
    assert th.verdict(2.0, ref_std=100.0) == "bug"


def test_max_abs_diff_handles_infinities():
    a = torch.tensor([1.0, -math.inf, 2.0])
    assert max_abs_diff(a, a.clone()) == 0.0
    assert max_abs_diff(a, torch.tensor([1.0, 0.0, 2.0])) == math.inf
    with pytest.raises(ValueError, match="shapes"):
        max_abs_diff(a, torch.zeros(2))


def test_bad_inputs_are_refused(sharp_model, prompt):
    eng, ref = EngineAdapter(sharp_model), FullRecompute(sharp_model)
    with pytest.raises(ValueError, match="context length is 32"):
        verify_implementation(eng, ref, [prompt], VerifyOptions(max_new_tokens=40))
    with pytest.raises(ValueError, match="non-empty"):
        verify_implementation(eng, ref, [[]], VerifyOptions(max_new_tokens=2))
    with pytest.raises(ValueError, match="chunk sizes"):
        verify_implementation(eng, ref, [prompt], VerifyOptions(max_new_tokens=2, chunk_sizes=(0,)))
    with pytest.raises(ValueError, match="reset"):
        verify_implementation(object(), ref, [prompt], VerifyOptions(max_new_tokens=2))
    with pytest.raises(ValueError, match="computed for 3 steps"):
        verify_implementation(eng, ReferenceRun(ref, 3), [prompt], VerifyOptions(max_new_tokens=2))


def test_wrong_logit_shape_is_an_implementation_error(sharp_model, prompt):
    fault = lambda s, kind, ids, mask, out: out[:, -1] if kind == "step" else out  # noqa: E731  (B,V) not (B,1,V)
    r = run(sharp_model, prompt, fault)
    assert r.verdict == "error"
    err = r.phase("incremental").error
    assert err.type == "ValueError" and "expected logits of shape" in err.message and err.call == 1
    assert r.phase("prefill").verdict == "pass"
    narrow = run(sharp_model, prompt, lambda s, kind, ids, mask, out: out[..., :-1] if kind == "step" else out)
    assert narrow.verdict == "error" and "expected logits of shape (1, 1, 50)" in narrow.errors[0].message


# ---- an implementation that raises: its own outcome, the other phases still run ------------------------
def test_exception_in_one_phase_is_error_and_the_rest_still_run(sharp_model, prompt):
    def fault(s, kind, ids, mask, out):
        if kind == "step" and ids.shape[1] > 1:
            raise RuntimeError("chunk kernel missing")
        return out

    r = run(sharp_model, prompt, fault, isolation=True)
    assert r.verdict == "error"
    (err,) = r.errors
    assert (err.phase, err.type, err.message, err.call) == ("chunk_4", "RuntimeError", "chunk kernel missing", 1)
    verdicts = {p.phase: p.verdict for p in r.phases}
    assert verdicts == {
        "prefill": "pass",
        "incremental": "pass",
        "chunk_1": "pass",
        "chunk_4": "error",
        "padded_batch": "pass",
        "isolation": "pass",
    }
    assert r.phase("chunk_4").calls == 1  # the prefill chunk was compared before the step raised
    d = json.loads(json.dumps(json_safe(r), allow_nan=False))
    assert d["verdict"] == "error" and d["errors"][0]["type"] == "RuntimeError"


def test_exception_in_prefill_and_reset(sharp_model, prompt):
    def fault(s, kind, ids, mask, out):
        if kind == "prefill" and mask is None and ids.shape[1] > 4:
            raise MemoryError("no room for the prompt")
        return out

    r = run(sharp_model, prompt, fault)
    assert r.verdict == "error" and r.errors[0].phase == "prefill" and r.errors[0].type == "MemoryError"
    assert r.phase("incremental").skipped and r.phase("chunk_4").verdict == "pass"

    class BadReset(Faulty):
        def reset(self):
            raise KeyError("cache")

    bad = verify_implementation(
        BadReset(sharp_model, lambda *a: a[-1]), FullRecompute(sharp_model), [prompt], VerifyOptions(max_new_tokens=2)
    )
    assert bad.verdict == "error" and {e.phase for e in bad.errors} >= {"prefill", "chunk_1", "isolation"}


# ---- the first differing step of every phase ----------------------------------------------------------
def test_first_diff_step_is_reported_per_phase(sharp_model, prompt):
    def fault(s, kind, ids, mask, out):
        if kind == "step" and ids.shape[1] > 1 and s.calls == 2:
            return out + 3.0  # the 2nd chunk of 4: greedy run clean
        return out

    r = run(sharp_model, prompt, fault)
    by_phase = r.first_diff_step_by_phase
    assert by_phase["chunk_4"] == 2 and by_phase["incremental"] is None and r.first_diff_step is None
    assert json_safe(r)["first_diff_step_by_phase"]["chunk_4"] == 2


def test_nan_logits_give_strict_json(sharp_model, prompt):
    r = run(sharp_model, prompt, lambda s, kind, ids, mask, out: out * float("nan") if kind == "step" else out)
    p = r.phase("incremental")
    assert r.verdict == "bug" and p.nonfinite_logits and math.isinf(p.max_abs_dlogit)

    def no_constants(name):
        raise AssertionError(f"non-standard JSON constant {name}")

    text = json.dumps(json_safe(r), allow_nan=False)  # raises ValueError if a NaN/inf float is left
    d = json.loads(text, parse_constant=no_constants)
    assert d["max_abs_dlogit"] == "inf" and d["phases"][1]["max_abs_dlogit"] == "inf"


def test_report_is_json_serialisable(sharp_model, prompt):
    d = json_safe(run(sharp_model, prompt, lambda s, kind, ids, mask, out: out))
    json.dumps(d)
    assert d["verdict"] == "pass" and set(d["max_abs_dlogit_by_phase"]) >= {"prefill", "incremental"}


def test_load_impl_calls_factories_with_or_without_the_model(sharp_model, monkeypatch):
    from pathlib import Path

    from genprobe.verify.adapters import ImplSpecError, load_impl

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent))
    assert load_impl("user_impls:correct", sharp_model).model is sharp_model
    assert load_impl("user_impls:standalone").vocab_size == 40
    with pytest.raises(ImplSpecError, match="at most one argument"):
        load_impl("user_impls:ReferenceRunLike", sharp_model)
