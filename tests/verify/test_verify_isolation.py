"""State that survives ``reset()``: the isolation phase, and why it needs a sequence other than the prompt.

The leaky implementation (tests/verify/user_impls.py ``ListCache(leak=True)``) is written from scratch
the way a user would: its ``reset()`` rewinds the position counter but forgets to empty the K/V lists,
so the next sequence attends to the previous one's keys. With one prompt replayed in every phase the
leaked keys are *the same* keys at the same positions (each one duplicated, so softmax weights are
unchanged) and every other phase passes; only a different sequence A before B exposes it.
"""

from __future__ import annotations

import json

import pytest

from genprobe.cli import main
from genprobe.verify.adapters import FullRecompute
from genprobe.verify.harness import VerifyOptions, isolation_partner, verify_implementation


def test_state_leaking_across_reset_is_a_bug(sharp_model, prompt, U):
    r = verify_implementation(
        U.leaky(sharp_model), FullRecompute(sharp_model), [prompt], VerifyOptions(max_new_tokens=10)
    )
    assert r.verdict == "bug"
    iso = r.phase("isolation")
    assert iso.verdict == "bug" and iso.max_abs_dlogit > 1.0 and iso.first_diff_step == 0
    # every phase that replays the one prompt is blind to the leak: only the phases that run a second sequence
    # after reset() (isolation, and the prefix-reuse phase with reset) caught it
    second_sequence = {"isolation", "prefix_reuse"}
    others = {p.phase: p.verdict for p in r.phases if p.phase not in second_sequence}
    assert set(others.values()) <= {"pass", "skipped"}, others
    assert r.phase("prefix_reuse").verdict == "bug"


def test_without_the_isolation_phase_the_leak_passes(sharp_model, prompt, U):
    """The reason for the phase (issue 12): with one prompt, nothing else sees the leak (the prefix-reuse phases,
    which also run several sequences, off as well)."""
    r = verify_implementation(
        U.leaky(sharp_model),
        FullRecompute(sharp_model),
        [prompt],
        VerifyOptions(max_new_tokens=10, isolation=False, prefix_reuse=False),
    )
    assert r.verdict == "pass"


def test_correct_list_cache_passes_isolation(sharp_model, prompt, U):
    r = verify_implementation(
        U.list_cache(sharp_model), FullRecompute(sharp_model), [prompt, prompt[:3]], VerifyOptions(max_new_tokens=10)
    )
    assert r.verdict == "pass" and r.phase("isolation").verdict == "pass"


def test_isolation_partner_differs_in_every_token_and_in_length():
    b = [3, 7, 11, 5]
    a = isolation_partner(b, [], vocab_size=12, max_len=32)
    assert len(a) == len(b) + 1 and all(x != y for x, y in zip(a, b, strict=False))
    assert isolation_partner(b, [], 12, max_len=4) == [4, 8, 0]  # no room for a longer one: shorter
    assert isolation_partner(b, [[3, 7]], 12, 32) == [4, 8, 0, 6, 7]  # a prefix of B would replay B's keys
    assert isolation_partner(b, [[9, 9, 9]], 12, 32) == [9, 9, 9]  # another prompt of another length
    assert isolation_partner([5], [], 12, max_len=1) == [6]


def test_cli_default_prompts_differ_and_the_leak_exits_1(capsys, tiny_ckpt, user_impls):
    rc = main(["verify-cache", str(tiny_ckpt), "--impl", f"{user_impls}:leaky", "--max-new-tokens", "8", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert len(d["prompts"]) == 2 and len({len(p) for p in d["prompts"]}) == 2  # two prompts, two lengths
    assert d["prompts"][0] != d["prompts"][1]
    assert rc == 1 and d["implementations"][0]["verdict"] == "bug"


@pytest.mark.parametrize("factory", ["list_cache", "correct"])
def test_correct_user_impls_pass_with_default_prompts(capsys, tiny_ckpt, user_impls, factory):
    rc = main(["verify-cache", str(tiny_ckpt), "--impl", f"{user_impls}:{factory}", "--max-new-tokens", "8", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["implementations"][0]["verdict"] == "pass"
