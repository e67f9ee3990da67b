"""verify-speculative: the exact distribution check passes the correct decoder (TV ~1e-7) and catches every mutant
of genprobe.verify.speculative.MUTANTS; greedy identity catches the four that change greedy output; the two-sample test
passes the correct decoder and catches deterministic acceptance; the command's exit statuses."""

from __future__ import annotations

import json

import pytest
import torch

from genprobe.cli import main
from genprobe.engine.samplers.stages import SamplerConfig
from genprobe.engine.speculative import make_draft
from genprobe.model.config import GPTConfig
from genprobe.model.gpt import GPT
from genprobe.model.load import load_model
from genprobe.verify.speculative import (
    EXACT_SAMPLER,
    MUTANTS,
    continued,
    default_prompts,
    exact_check,
    greedy_check,
    two_sample_check,
)

LOOPY = "春眠不覺曉，處處聞啼鳥。春眠不覺曉，處處"


def _random_gpt(seed: int, layers: int, d: int, attn: float) -> GPT:
    """A random GPT whose attention is sharpened (stale keys matter) and whose logits are peaked (p far from q)."""
    torch.manual_seed(seed)
    m = GPT(GPTConfig(vocab_size=16, n_layer=layers, n_head=2, d_model=d, d_ff=2 * d, block_size=64)).eval()
    with torch.no_grad():
        for block in m.h:
            block.attn.c_attn.weight.mul_(attn)
        m.lm_head.weight.mul_(5.0)
    return m


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Many tiny forwards: one thread each (what the test command's workers use anyway)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def pair():
    """(target, draft): two unrelated random GPTs of one vocabulary, the draft smaller."""
    target = _random_gpt(0, 2, 32, 3.0)
    return target, make_draft(target, _random_gpt(1, 1, 16, 1.0))


@pytest.mark.parametrize("name", list(MUTANTS))
def test_exact_distribution_passes_correct_and_catches_each_mutant(pair, name):
    target, draft = pair
    prompt = default_prompts(16)[0]
    check = exact_check(target, draft, prompt, n=3, k=1, decoder=MUTANTS[name])
    assert check.drafted > 0 and check.runs > 1
    if name == "correct":
        assert check.verdict == "pass" and check.total_variation < 1e-6, check
        assert check.margin > 100
    else:
        assert check.verdict == "bug" and check.margin > 100, check  # TV > 1e-2 (measured: 0.06 .. 0.44)


def test_exact_check_with_two_drafts_per_round(pair):
    target, draft = pair
    check = exact_check(target, draft, default_prompts(16)[1], n=3, k=2)
    assert check.verdict == "pass" and check.total_variation < 1e-6


@pytest.mark.parametrize("name", list(MUTANTS))
def test_exact_check_of_prompt_lookup_on_the_char_gpt(trained_ckpt, name):
    """q a point mass: accepted with p(x), the residual is p without x. The prompt ends in the model's own loop."""
    m = load_model(trained_ckpt)
    prompt = continued(m.module, m.encode(LOOPY), 3)
    check = exact_check(m.module, make_draft(m.module, "lookup"), prompt, n=3, k=1, decoder=MUTANTS[name])
    assert check.drafted > 0
    if name == "correct":
        assert check.verdict == "pass" and check.total_variation < 1e-6, check
    else:
        assert check.verdict == "bug" and check.margin > 10, check


def test_exact_check_with_nothing_drafted_is_not_checked(pair):
    target, _ = pair
    check = exact_check(target, make_draft(target, "lookup"), [1, 2, 3], n=2, k=1)  # no n-gram repeats
    assert check.drafted == 0 and check.verdict == "not checked"


@pytest.mark.parametrize("name", list(MUTANTS))
def test_greedy_identity_on_the_char_gpt(trained_ckpt, name):
    m = load_model(trained_ckpt)
    prompts = [m.encode(LOOPY), m.encode("白日依山盡")]
    check = greedy_check(m.module, make_draft(m.module, "lookup"), prompts, 24, 3, decoder=MUTANTS[name])
    changes_greedy = name in ("dropped_bonus", "doubled_bonus", "no_rollback", "verify_off_by_one")
    assert check.verdict == ("bug" if changes_greedy else "pass"), check
    if changes_greedy:
        assert check.first_divergence is not None and check.first_divergence["prompt"] == 0


def test_two_sample_check(pair):
    target, draft = pair
    prompt = default_prompts(16)[1]
    ok = two_sample_check(target, draft, prompt, 2, 1, EXACT_SAMPLER, samples=300)
    assert ok.verdict == "pass" and ok.p_value >= 0.01 and 0 < ok.min_detectable_shift < 0.2
    bad = two_sample_check(
        target, draft, prompt, 2, 1, EXACT_SAMPLER, samples=300, decoder=MUTANTS["verify_off_by_one"]
    )
    assert bad.verdict == "bug" and bad.p_value < 0.01


def test_cli_json_and_mutants(trained_ckpt, capsys):
    rc = main(["verify-speculative", str(trained_ckpt), "--prompt", LOOPY, "--max-new-tokens", "12", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["verdict"] == "pass" and out["greedy"]["verdict"] == "pass"
    assert out["exact"]["total_variation"] < 1e-6


def test_cli_bad_input_is_one_line(trained_ckpt, capsys):
    for argv, needle in (
        (["--k", "0"], "must be an integer >= 1, got 0"),
        (["--draft", "layers:5"], "keeps 1 .. 1 of the target's 2 layers, got 5"),
        (["--samples", "3"], "--samples must be 0 (off) or >= 20"),
    ):
        rc = main(["verify-speculative", str(trained_ckpt), *argv])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and needle in err[0], err


@pytest.fixture(scope="module")
def llama_pair():
    """(target, draft): a tiny random transformers Llama (DynamicCache cropped on rejection, RoPE positions) and its
    own first layer as the draft; weights drawn wider than the default (std 0.1, not 0.02) so that attention is
    not uniform (stale keys matter) and p differs from q."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from genprobe.engine.hf_adapter import HFCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=16,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
        initializer_range=0.1,
    )
    target = HFCausalLM(LlamaForCausalLM(cfg).eval())
    return target, make_draft(target, "layers:1")


@pytest.mark.parametrize("name", list(MUTANTS))
def test_exact_check_catches_each_mutant_on_a_transformers_llama(llama_pair, name):
    """The Llama family (the Llama reference's and SmolLM2's): every mutant caught with a margin, the correct
    decoder at float32 noise."""
    target, draft = llama_pair
    prompt = default_prompts(16)[0]
    top2 = SamplerConfig(temperature=1.0, top_k=2)  # a smaller tree: each transformers forward costs ~1 ms
    check = exact_check(target, draft, prompt, n=3, k=1, sampler=top2, decoder=MUTANTS[name])
    assert check.drafted > 0 and check.runs > 1
    if name == "correct":
        assert check.verdict == "pass" and check.total_variation < 1e-6, check
    else:
        assert check.verdict == "bug" and check.margin > 100, check  # measured TV 0.14 .. 0.53
