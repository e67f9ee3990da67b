"""Prefix reuse across sequences: the cases, the phases, and the prefix-cache mutants they must catch.

A prefix cache keeps blocks across sequences; its classic bugs (a key over part of the block, a match
one token short, a key without the parent's tokens) only show when a later sequence shares *some*
tokens with an earlier one. Every other phase replays one prompt per fresh cache, so without the
prefix-reuse phases all three flawed caches pass (tested below: the reason for the phases).
"""

from __future__ import annotations

import pytest
import torch

from genprobe.verify.adapters import EngineAdapter, FullRecompute
from genprobe.verify.harness import ReferenceRun, VerifyOptions, verify_implementation
from genprobe.verify.mutants import MUTANTS, PrefixCache, mutant, run_mutant_reports
from genprobe.verify.reuse import REUSE_LENGTH, reuse_cases

FLAWS = ("prefix_half_key", "prefix_stale_tail", "prefix_no_parent")
PROMPT = [3, 7, 11, 5, 9, 2, 8]
REUSE_PHASES = {"prefix_reuse", "prefix_reuse_no_reset"}


def test_the_plan_shares_prefixes_of_several_block_sizes():
    base = list(range(1, 49))
    cases = {c.name: c for c in reuse_cases(base, vocab=60, length=REUSE_LENGTH)}
    # diverging at the first token of a block (8/16/32), inside one (4/13/24), at its last token (7/15/31)
    for s in (1, 4, 7, 8, 13, 15, 16, 24, 31, 32):
        seq = cases[f"shared {s}"].seq
        assert list(seq[:s]) == base[:s] and seq[s] != base[s] and len(seq) == 48
    for i in (7, 15, 31):  # the last token of a block of 8, 16, 32; everything after it A's
        seq = cases[f"token {i} changed"].seq
        assert [j for j in range(48) if seq[j] != base[j]] == [i]
    replaced = cases["first 16 replaced"].seq
    assert all(replaced[j] != base[j] for j in range(16)) and list(replaced[16:]) == base[16:]
    assert cases["first 16 replaced, again"].seq == replaced and cases["A again"].seq == tuple(base)
    # prompts a cache holds whole, shorter than the sequence it holds, right after that sequence
    names = list(cases)
    assert names[-3:] == ["A again", "first 32 of A, then others", "first 20 of A, then others"]
    for n in (32, 20):
        seq = cases[f"first {n} of A, then others"].seq
        assert len(seq) == n + 2 and list(seq[:n]) == base[:n] and all(seq[j] != base[j] for j in (n, n + 1))
    # a 32-position context: the cases that need more than 32 tokens are left out
    short = {c.name for c in reuse_cases(base, vocab=60, length=32)}
    assert "shared 32" not in short and "token 31 changed" not in short and "shared 16" in short


def test_engine_runs_both_phases_and_reproduces_a_repeat(long_model):
    r = verify_implementation(
        EngineAdapter(long_model), FullRecompute(long_model), [PROMPT], VerifyOptions(max_new_tokens=4)
    )
    assert r.verdict == "pass"
    for name in REUSE_PHASES:
        p = r.phase(name)
        assert p.verdict == "pass" and p.calls == len(p.cases) == 19
    repeat = next(c for c in r.phase("prefix_reuse").cases if c["kind"] == "repeat")
    assert repeat["bit_identical_to_first_run"] and repeat["max_abs_dlogit_vs_first_run"] == 0.0
    assert any("shared prefix of 1, 4, 7, 8, 13, 15, 16, 24, 31, 32 tokens" in s for s in r.reuse)
    assert any("prefixes of 32, 20 tokens of a cached sequence, then other tokens" in s for s in r.reuse)
    assert "back to back without reset()" in r.reuse


def test_back_to_back_only_where_the_protocol_allows_it(long_model, U):
    """A user implementation whose prefill() needs reset() first: that phase is skipped, and says why."""
    r = verify_implementation(
        U.list_cache(long_model), FullRecompute(long_model), [PROMPT], VerifyOptions(max_new_tokens=4)
    )
    assert r.verdict == "pass" and r.phase("prefix_reuse").verdict == "pass"
    skipped = r.phase("prefix_reuse_no_reset")
    assert skipped.verdict == "skipped" and "prefill_starts_sequence" in skipped.skipped
    assert any(s.startswith("not back to back") for s in r.reuse)


@pytest.fixture(scope="module")
def prefix_reports(long_model):
    run = ReferenceRun(FullRecompute(long_model), 4)
    names = ("prefix_correct", *FLAWS)
    return {
        r.impl: r
        for r in run_mutant_reports(
            long_model, [PROMPT], VerifyOptions(max_new_tokens=4, chunk_sizes=(4,)), names=names, run=run
        )
    }


def test_correct_prefix_cache_passes_and_really_reuses_blocks(long_model):
    cache = PrefixCache(long_model)
    r = verify_implementation(
        cache, FullRecompute(long_model), [PROMPT], VerifyOptions(max_new_tokens=4, chunk_sizes=(4,), isolation=False)
    )
    assert r.verdict == "pass", r.max_abs_dlogit_by_phase
    # blocks of several sequences were kept and reused (a pass without reuse would prove nothing)
    assert cache.block == 16 and len(cache.store) >= 6 and cache.reused >= 8
    assert MUTANTS["prefix_correct"] == "pass"


@pytest.mark.parametrize("flaw", FLAWS)
def test_each_prefix_flaw_is_caught_only_by_the_reuse_phases(prefix_reports, flaw):
    r = prefix_reports[flaw]
    assert r.verdict == "bug" and MUTANTS[flaw] == "flagged"
    for p in r.phases:
        assert (p.verdict == "bug") == (p.phase in REUSE_PHASES), (p.phase, p.verdict)
    assert prefix_reports["prefix_correct"].verdict == "pass"


def test_the_slot_flaw_shows_only_on_a_prompt_shorter_than_the_cached_sequence(trained_reports):
    """The shorter cases (#46) prefill a prefix of the sequence just run, then step other tokens: a slot that keeps
    its tail in the attention is caught there; the correct slot reuses the same prefixes and passes."""
    assert trained_reports["slot_no_truncate"].verdict == "bug"
    for phase in REUSE_PHASES:
        bad = [c for c in trained_reports["slot_no_truncate"].phase(phase).cases if c["max_abs_dlogit"] > 1e-4]
        # both shorter cases (a prefix of the sequence just run) are off, one beyond the bug line
        shorter = [c["max_abs_dlogit"] for c in bad if c["kind"] == "shorter"]
        assert len(shorter) == 2 and max(shorter) > 1.0, bad
        ok = trained_reports["slot_correct"].phase(phase).cases
        assert all(c["max_abs_dlogit"] < 1e-4 for c in ok), ok


def test_a_correct_slot_really_reuses_its_prefix(long_model):
    from genprobe.verify.mutants import SlotCache

    cache = SlotCache(long_model)
    r = verify_implementation(
        cache, FullRecompute(long_model), [PROMPT], VerifyOptions(max_new_tokens=4, chunk_sizes=(4,), isolation=False)
    )
    assert r.verdict == "pass", r.max_abs_dlogit_by_phase
    assert cache.reused >= 100  # the continuations, the repeat and the shorter prompts came from the slot


def test_without_the_reuse_phases_every_prefix_flaw_passes(long_model):
    run = ReferenceRun(FullRecompute(long_model), 4)
    for flaw in FLAWS:
        r = verify_implementation(
            mutant(long_model, flaw),
            run,
            [PROMPT],
            VerifyOptions(max_new_tokens=4, prefix_reuse=False, isolation=False),
        )
        assert r.verdict == "pass", (flaw, r.max_abs_dlogit_by_phase)


def test_unknown_prefix_flaw_is_refused(long_model):
    with pytest.raises(ValueError, match="unknown mutant .prefix_off_by_two. of PrefixCache"):
        PrefixCache(long_model, "prefix_off_by_two")


# ---- margins on a trained model: every mutant caught at >= 3x the bug line ---------------------------------
@pytest.fixture(scope="module")
def trained_reports(trained):
    from genprobe.verify.mutants import DEFAULT_PROMPT

    model, tok, _ = trained
    ids = tok.encode(DEFAULT_PROMPT, warn=False)
    return {r.impl: r for r in run_mutant_reports(model, [ids], VerifyOptions(max_new_tokens=24))}


def test_every_mutant_is_caught_decisively_on_a_trained_model(trained_reports):
    assert set(trained_reports) == set(MUTANTS)
    for name, r in trained_reports.items():
        if MUTANTS[name] == "pass":
            assert r.verdict == "pass", (name, r.max_abs_dlogit_by_phase)
        else:
            assert r.verdict == "bug" and r.bug_margin >= 3.0, (name, r.bug_margin, r.max_abs_dlogit_by_phase)


def test_a_row_swap_is_caught_by_the_padded_batch_phase_alone(trained_reports, trained):
    """batch_row_swap trades rows 0 and 1's last prompt key/value after a batched prefill: every single-sequence
    phase passes, the padded batch (each row against its prompt alone) catches it decisively, per row."""
    r = trained_reports["batch_row_swap"]
    by = r.max_abs_dlogit_by_phase
    assert max(v for k, v in by.items() if k != "padded_batch") < 1e-4, by
    padded = r.phase("padded_batch")
    assert padded.verdict == "bug" and padded.bug_margin >= 3.0, (padded.bug_margin, by)
    rows = padded.per_row
    assert rows is not None and len(rows) >= 2
    assert all(row["max_abs_dlogit"] > 1.0 for row in rows[:2]), rows  # both swapped rows are wrong
    model, tok, _ = trained
    from genprobe.verify.mutants import DEFAULT_PROMPT

    ids = tok.encode(DEFAULT_PROMPT, warn=False)
    alone = run_mutant_reports(model, [ids], VerifyOptions(max_new_tokens=24), names=("batch_row_swap",))[0]
    assert alone.phase("padded_batch") is not None  # the phase runs for the batched mutant by default


def test_the_row_swap_mutant_also_runs_on_a_transformers_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    hf = LlamaForCausalLM(cfg).eval()
    r = run_mutant_reports(
        hf,
        [[3, 7, 11, 5, 9, 2, 8, 4]],
        VerifyOptions(max_new_tokens=4, chunk_sizes=(4,)),
        names=("correct", "batch_row_swap"),
    )
    ok, swap = r
    assert ok.verdict == "pass" and swap.phase("padded_batch").max_abs_dlogit > 100 * ok.max_abs_dlogit, (
        swap.max_abs_dlogit_by_phase
    )
