"""The fast path on Llama-family transformers models: LlamaFamily's forward over the model's own weights equals
transformers' forward, and compiled greedy decoding equals transformers' greedy tokens on every family architecture
of the matrix (verify/hf_matrix.py: llama, qwen2, mistral with its sliding window, phi3 with fused projections) and
on Qwen3 (query/key norms).

The eager tests compare bit for bit (same ops, same order) with ``transformers`` eager attention; the compiled ones
compare greedy tokens of padded batches, each model's scores scaled (init 0.5) so that logits are far apart and a
wrong key, position, window or norm changes a token.
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch

from genprobe.engine.cache import KVCache
from genprobe.engine.generate import generate
from genprobe.engine.hf_adapter import HFCausalLM
from genprobe.engine.runner import fast_module
from genprobe.model.llama_family import LlamaFamily, llama_family_of, unsupported_reason
from genprobe.verify.hf_matrix import tiny_model

FAMILY_MATRIX = ("llama", "qwen2", "mistral", "phi3", "qwen3")

# Each compiled test builds ahead-of-time programs for its own model (~40 s of a core each, ~2 min per verify-cache
# run): all of them would put the test command past its 10 minutes. The test command runs the llama one (grouped
# queries, left padding, the whole fast-path wiring); GENPROBE_ALL_COMPILE_TESTS=1 runs every architecture and dtype
# (all passed on the commit that added them: 8 passed, 509 s of compiling on one core).
ALL_COMPILE = os.environ.get("GENPROBE_ALL_COMPILE_TESTS") == "1"
every_compile = pytest.mark.skipif(not ALL_COMPILE, reason="set GENPROBE_ALL_COMPILE_TESTS=1 (minutes of compiling)")
PROMPTS = [[5, 17, 42, 8, 91, 23, 64, 30], [12, 77, 3, 56, 9], [40, 2, 88]]


def family_model(arch: str):
    """A seeded 2-layer model of ``arch`` with grouped-query attention (qwen3 is not in the matrix: built here;
    ``llama-yarn``: the matrix's llama with YaRN RoPE scaling, whose cos/sin carry an attention factor != 1)."""
    if arch == "llama-yarn":
        import transformers as T

        from genprobe.verify.hf_matrix import tiny_config

        cfg = tiny_config("llama", init=0.5)
        cfg.rope_parameters = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
        cfg.rope_parameters["rope_theta"] = 10000.0
        torch.manual_seed(0)
        return T.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    if arch != "qwen3":
        return tiny_model(arch, init=0.5)
    import transformers as T

    cfg = T.Qwen3Config(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        pad_token_id=0,
        initializer_range=0.5,
    )
    torch.manual_seed(0)
    model = T.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    with torch.no_grad():  # query/key norms away from 1, so that a norm left out changes the scores
        for name, p in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                p.uniform_(0.5, 2.0)
    return model


def _padded(prompts):
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


@pytest.mark.parametrize("arch", [*FAMILY_MATRIX, "llama-yarn"])
def test_the_forward_equals_transformers_bit_for_bit_with_left_padding(arch):
    hf = family_model(arch)
    view = LlamaFamily(hf)
    if arch == "llama-yarn":
        assert view.cfg.attention_scaling > 1.1  # the scaling is in play: leaving it out would change the logits
    ids, mask = _padded([*PROMPTS, list(range(1, 21))])  # 20 positions: past YaRN's original 16
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, position_ids=positions).logits
        out = view(ids, positions=positions, attention_mask=mask)
    real = mask.bool()
    assert torch.equal(out[real], ref[real])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.int8], ids=["bfloat16", "int8"])
def test_the_forward_equals_transformers_with_a_narrow_output_layer(dtype):
    """Weight-only layers, the tied output layer included (``narrow_output``): the view runs the converted head."""
    from genprobe.model.weight_only import WeightOnlyLinear, with_weight_dtype

    base = family_model("llama")
    base.lm_head.weight = base.model.embed_tokens.weight  # tied, as SmolLM2's (the matrix's llama is not)
    hf = with_weight_dtype(base, dtype, narrow_output=True)
    assert isinstance(hf.lm_head, WeightOnlyLinear) and hf.model.embed_tokens.weight.dtype == torch.float32
    view = LlamaFamily(hf)
    assert view.lm_head is hf.lm_head
    ids, mask = _padded(PROMPTS)
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, position_ids=positions).logits
        out = view(ids, positions=positions, attention_mask=mask)
        kept = LlamaFamily(with_weight_dtype(base, dtype))(ids, positions=positions, attention_mask=mask)
    real = mask.bool()
    # Not bit for bit: MKL's float32 products may sum in another order for another allocation of the narrow copies.
    assert float((out[real] - ref[real]).abs().max()) < 1e-4
    assert float((out[real] - kept[real]).abs().max()) > 1e-3  # the narrow head is the one that ran


@pytest.mark.parametrize("arch", FAMILY_MATRIX)
def test_cached_decoding_through_the_forward_equals_recomputation(arch):
    hf = family_model(arch)
    view = llama_family_of(hf)
    ids = torch.randint(1, 100, (2, 14), generator=torch.Generator().manual_seed(1))
    cache = KVCache.for_model(view.cfg, 2, max_len=16)
    with torch.no_grad():
        full = hf(ids).logits
        steps = [view(ids[:, :5], cache=cache)] + [view(ids[:, i : i + 1], cache=cache) for i in range(5, 14)]
    assert cache.length == 14
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-4)


def test_the_view_shares_the_models_weights_and_sees_edits_made_in_place():
    hf = family_model("llama")
    view = llama_family_of(hf)
    assert llama_family_of(hf) is view
    assert view.layers[1].down_proj.weight is hf.model.layers[1].mlp.down_proj.weight
    assert view.lm_head is hf.lm_head and view.wte is hf.model.embed_tokens
    n_hf = sum(p.numel() for p in hf.parameters())
    assert view.num_parameters() == n_hf
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        hf.model.layers[1].mlp.down_proj.weight.mul_(3)
        assert torch.equal(view(ids), hf(ids).logits)


def test_the_window_of_mistral_masks_keys_that_transformers_masks():
    hf = family_model("mistral")  # window 6: a 12-token prompt has keys outside it
    view = LlamaFamily(hf)
    assert view.cfg.windows == (6, 6)
    ids = torch.randint(1, 100, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(ids).logits
        assert torch.equal(view(ids), ref)
        unwindowed = view._visibility  # without the window the late positions change: the window is what matches
        view._visibility = lambda *a, window=None, **k: unwindowed(*a, **k)
        assert not torch.allclose(view(ids)[:, 8:], ref[:, 8:], atol=1e-3)


@pytest.mark.parametrize(
    ("arch", "reason"), [("gpt2", "not in the Llama family"), ("gemma2", "not in the Llama family")]
)
def test_other_architectures_are_refused_with_the_reason(arch, reason):
    hf = tiny_model(arch)
    assert reason in unsupported_reason(hf)
    with pytest.raises(ValueError, match="compile=True cannot run this transformers model: model_type"):
        fast_module(HFCausalLM(hf))
    with pytest.raises(ValueError, match=reason):
        generate(HFCausalLM(hf), [[1, 2, 3]], max_new_tokens=2, compile=True)


def test_hooks_the_fast_forward_would_skip_are_refused_and_those_it_runs_are_allowed():
    hf = family_model("llama")
    handle = hf.model.layers[0].register_forward_hook(lambda *a: None)
    with pytest.raises(ValueError, match=r"forward hooks on model\.layers\.0 would not run"):
        fast_module(HFCausalLM(hf))
    handle.remove()
    handle = hf.model.layers[0].mlp.down_proj.register_forward_hook(lambda *a: None)
    assert fast_module(HFCausalLM(hf)) is llama_family_of(hf)  # the view calls down_proj: its hook runs
    handle.remove()


@pytest.mark.parametrize("arch", [a if a == "llama" else pytest.param(a, marks=every_compile) for a in FAMILY_MATRIX])
def test_compiled_greedy_tokens_equal_transformers_greedy(arch):
    hf = family_model(arch)
    runner = HFCausalLM(hf)
    ref = generate(runner, PROMPTS, max_new_tokens=12)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a fallback to eager decoding would pass unnoticed
        out = generate(runner, PROMPTS, max_new_tokens=12, compile=True)
    assert out.tokens == ref.tokens
    ids, mask = _padded(PROMPTS)
    hf_tokens = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False)
    assert [row[-12:] for row in hf_tokens.tolist()] == ref.tokens  # transformers' own generate agrees


@every_compile
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
def test_verify_cache_compiled_passes_for_each_weight_dtype(tmp_path, capsys, dtype):
    """The compiled decode path of a transformers Llama (grouped queries), float32 and weight-only: each model's
    cache against its own recomputation (a narrow model is a different model, with its own verdict)."""
    import json

    from genprobe.cli import main

    d = tmp_path / "llama"
    family_model("llama").save_pretrained(d)  # no tokenizer: the verifier's own token-id prompts
    args = ["verify-cache", str(d), "--compiled", "--weight-dtype", dtype, "--max-new-tokens", "8", "--json"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    names = [i["impl"] for i in report["implementations"]]
    assert names == ["hf:llama", "engine-compiled"]
    assert all(i["verdict"] == "pass" for i in report["implementations"])
    assert report["weight_dtype"] == dtype
