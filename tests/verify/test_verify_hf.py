"""transformers causal LMs through the HF adapter: their own cache against recomputation."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from genprobe.verify import HFAdapter, HFReference, verify_implementation  # noqa: E402

PROMPTS = [[5, 17, 42, 8, 91, 23, 64, 30], [12, 77, 3, 56, 9], [40, 2, 88]]
STEPS = 4


def tiny_hf(kind: str, init: float = 0.02):
    """A seeded random causal LM from a small config (eager attention, vocab 100)."""
    torch.manual_seed(0)
    common = dict(vocab_size=100, initializer_range=init, attn_implementation="eager",
                  bos_token_id=None, eos_token_id=None, pad_token_id=0)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(n_positions=64, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0,
                                      embd_pdrop=0.0, attn_pdrop=0.0, **common)
        return transformers.GPT2LMHeadModel(cfg).eval()
    kw = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, **common)
    if kind == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**kw)).eval()
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**kw)).eval()


@pytest.mark.parametrize("kind", ["gpt2", "llama", "qwen2"])
def test_hf_models_pass(kind):
    hf = tiny_hf(kind, init=0.2)
    r = verify_implementation(HFAdapter(hf), HFReference(hf), PROMPTS, steps=STEPS, chunk_sizes=(1, 4))
    assert r.verdict == "pass", r.max_by_phase()
    assert r.phase("padded_batch").skipped is None
    assert r.text_divergences == 0


def test_gpt2_left_padding_without_position_ids_is_flagged():
    hf = tiny_hf("gpt2", init=0.2)
    bad = verify_implementation(HFAdapter(hf, pass_position_ids=False), HFReference(hf), PROMPTS, steps=STEPS,
                                chunk_sizes=(4,))
    assert bad.verdict == "bug", bad.max_by_phase()
    assert bad.worst_phase == "padded_batch"
    # unpadded runs are fine: the bug needs left padding, which only the padded-batch comparison makes
    assert all(p.max_abs_dlogit < 1e-4 for p in bad.phases if p.phase != "padded_batch")
    good = verify_implementation(HFAdapter(hf, pass_position_ids=True), HFReference(hf), PROMPTS, steps=STEPS,
                                 chunk_sizes=())
    assert good.verdict == "pass", good.max_by_phase()


def test_llama_rope_is_immune_to_the_position_shift():
    # RoPE scores depend on position differences only; a constant per-row shift changes nothing
    hf = tiny_hf("llama", init=0.2)
    r = verify_implementation(HFAdapter(hf, pass_position_ids=False), HFReference(hf), PROMPTS, steps=STEPS,
                              chunk_sizes=())
    assert r.verdict == "pass", r.max_by_phase()


def test_converted_genprobe_model_agrees_through_hf(sharp_model, prompt):
    from genprobe.model.hf import to_hf_gpt2
    from genprobe.verify import FullRecompute

    hf = to_hf_gpt2(sharp_model)
    r = verify_implementation(HFAdapter(hf), FullRecompute(sharp_model), [prompt], steps=STEPS, padded_batch=False)
    assert r.verdict == "pass", r.max_by_phase()
