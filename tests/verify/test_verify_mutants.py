"""The engine passes; every planted cache bug is caught; the harmless permutation is not flagged."""

from __future__ import annotations

import pytest
import torch

from genprobe.model.config import GPTConfig
from genprobe.model.gpt import GPT
from genprobe.verify.adapters import EngineAdapter, FullRecompute
from genprobe.verify.harness import VerifyOptions, verify_implementation
from genprobe.verify.mutants import (
    DEFAULT_PROMPT,
    TEACHING,
    TeachingCache,
    cache_exact,
    mask_noop,
    run_mutant_reports,
    run_mutants,
)

BUGS = ("pos_zero", "no_cat", "no_mask", "kv_mismatch")


def test_engine_passes_with_exact_prefill(sharp_model, prompt):
    r = verify_implementation(
        EngineAdapter(sharp_model), FullRecompute(sharp_model), [prompt, prompt[:4]], VerifyOptions(max_new_tokens=8)
    )
    assert r.prefill_bit_identical
    assert r.phase("prefill").max_abs_dlogit == 0.0
    assert r.phase("incremental").max_abs_dlogit < 1e-4
    assert r.phase("padded_batch").skipped is None and r.phase("padded_batch").max_abs_dlogit < 1e-4
    assert {p.phase for p in r.phases} == {
        "prefill",
        "incremental",
        "chunk_1",
        "chunk_4",
        "padded_batch",
        "isolation",
        "prefix_reuse",
        "prefix_reuse_no_reset",
    }
    assert r.verdict == "pass" and r.text_divergences == 0 and r.first_diff_step is None


@pytest.mark.parametrize("pos_encoding", ["rope", "none"])
def test_engine_passes_other_position_encodings(pos_encoding, prompt):
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=50, n_layer=2, n_head=2, d_model=32, d_ff=64, block_size=32, pos_encoding=pos_encoding)
    m = GPT(cfg)
    r = verify_implementation(
        EngineAdapter(m), FullRecompute(m), [prompt], VerifyOptions(max_new_tokens=6, chunk_sizes=(3,))
    )
    assert r.verdict == "pass" and r.prefill_bit_identical


@pytest.fixture(scope="module")
def tiny_reports(shared_sharp_model):
    prompt = [3, 7, 11, 5, 9, 2, 8]
    return {
        r.impl: r
        for r in run_mutant_reports(shared_sharp_model, [prompt], VerifyOptions(max_new_tokens=10), names=TEACHING)
    }


def test_teaching_correct_and_cat_order_pass(tiny_reports):
    for name in ("correct", "cat_order"):
        r = tiny_reports[name]
        assert r.verdict == "pass", (name, r.max_abs_dlogit_by_phase)
        assert r.prefill_bit_identical and r.text_divergences == 0


@pytest.mark.parametrize("bug", BUGS)
def test_each_bug_is_judged_a_bug_on_a_tiny_model(tiny_reports, bug):
    r = tiny_reports[bug]
    assert r.verdict == "bug", r.max_abs_dlogit_by_phase
    assert r.first_diff_step == (0 if bug == "no_mask" else 1)  # no_mask breaks prefill; the rest the first step
    # pos_zero/no_cat/kv_mismatch are invisible in prefill (past = 0): the seed's "prefill test passes"
    assert r.prefill_bit_identical == (bug != "no_mask")


def test_mask_noop_exactly_zero_at_single_token_steps(sharp_model, prompt):
    d = mask_noop(sharp_model, prompt, steps=12)
    assert d["no_mask_t_new_1"] == 0.0
    assert d["no_mask_chunk_4"] > 1.0


def test_no_mask_is_invisible_token_by_token(tiny_reports):
    r = tiny_reports["no_mask"]
    assert r.phase("chunk_1").max_abs_dlogit < 1e-4  # every call has T_new = 1
    assert r.phase("chunk_4").max_abs_dlogit > 1.0


def test_teaching_cache_refuses_padding_and_unknown_bug(sharp_model):
    with pytest.raises(ValueError, match="unknown mutant"):
        TeachingCache(sharp_model, "off_by_one")
    with pytest.raises(NotImplementedError):
        TeachingCache(sharp_model).prefill(torch.ones(1, 3, dtype=torch.long), torch.tensor([[0, 1, 1]]))


# ---- on the trained Tang checkpoint -----------------------------------------------------------------
@pytest.fixture(scope="module")
def trained_rows(trained):
    model, tok, _ = trained
    ids = tok.encode(DEFAULT_PROMPT, warn=False)
    return {r["impl"]: r for r in run_mutants(model, ids, steps=24)}, model, ids


def test_trained_mutant_table(trained_rows):
    rows, _, _ = trained_rows
    assert set(rows) == set(TEACHING)  # the chapter's table: the teaching mutants (prefix ones: test_verify_reuse)
    for row in rows.values():
        assert row["as_expected"], row
    for bug in BUGS:
        assert rows[bug]["verdict"] == "bug" and rows[bug]["max_abs_dlogit"] > 1.0
    for ok in ("correct", "cat_order"):
        assert rows[ok]["max_abs_dlogit"] < 1e-4 and rows[ok]["prefill_bit_identical"]
    # the bugs that break decode steps also change the greedy text; text comparison sees them
    for bug in ("pos_zero", "no_cat", "kv_mismatch"):
        assert rows[bug]["text_divergences"] > 0 and rows[bug]["text_only_would_catch"]


def test_trained_engine_exact_and_mask_contrast(trained_rows):
    _, model, ids = trained_rows
    ex = cache_exact(model, ids, steps=24)
    assert ex["prefill_bit_identical"] and ex["prefill_max_abs_dlogit"] == 0.0
    assert ex["incremental_max_abs_dlogit"] < 1e-4 and ex["chunk4_max_abs_dlogit"] < 1e-4
    d = mask_noop(model, ids, steps=24)
    assert d["no_mask_t_new_1"] == 0.0 and d["no_mask_chunk_4"] > 1.0
