"""Q/K/V gradient tracking: one value per (step, layer, projection), correct slicing, files written."""

import csv
import json

import pytest
import torch

from genprobe.attention.gradients import QKVGradTracker
from genprobe.corpus.tang import load_corpus
from genprobe.model.config import GPTConfig
from genprobe.model.train import TrainConfig, train


def test_three_step_training_run(tokenizer, tmp_path):
    corpus = load_corpus(poems=200)
    tracker = QKVGradTracker()
    cfg = GPTConfig(vocab_size=tokenizer.vocab_size, n_layer=2, n_head=2, d_model=32, d_ff=64, block_size=16)
    train(
        corpus,
        tokenizer,
        cfg=cfg,
        tc=TrainConfig(steps=3, batch_size=4, warmup=1, eval_every=0),
        progress=False,
        on_backward=tracker,
    )
    rows = tracker.rows
    assert sorted((r["step"], r["layer"]) for r in rows) == [(s, layer) for s in range(3) for layer in range(2)]
    for r in rows:
        for k in ("q", "k", "v"):
            assert isinstance(r[k], float) and r[k] > 0
    info = tracker.save(tmp_path)
    assert info["steps"] == 3 and info["layers"] == 2 and info["rows"] == 6
    with open(tmp_path / "qkv_grad_norms.csv") as fh:
        assert len(list(csv.DictReader(fh))) == 6
    assert len(json.loads((tmp_path / "qkv_grad_norms.json").read_text())["rows"]) == 6
    assert (tmp_path / "qkv_grad_norms.png").read_bytes()[:4] == b"\x89PNG"


def _fill_grads(model):
    for p in model.parameters():
        p.grad = torch.zeros_like(p)


def test_fused_slicing_ours_and_gpt2_conv1d(tiny_model):
    from genprobe.model.hf import to_hf_gpt2

    C = tiny_model.cfg.d_model
    _fill_grads(tiny_model)
    ca = tiny_model.h[1].attn.c_attn
    ca.weight.grad[C : 2 * C] = 1.0  # only K rows of layer 1
    ca.bias.grad[2 * C :] = 2.0  # only V bias
    t = QKVGradTracker()
    t(0, tiny_model)
    r = {row["layer"]: row for row in t.rows}
    assert r[0] == {"step": 0, "layer": 0, "q": 0.0, "k": 0.0, "v": 0.0}
    assert r[1]["q"] == 0.0
    assert r[1]["k"] == pytest.approx((C * C) ** 0.5)
    assert r[1]["v"] == pytest.approx((4.0 * C) ** 0.5)

    hf = to_hf_gpt2(tiny_model)
    _fill_grads(hf)
    hf.transformer.h[0].attn.c_attn.weight.grad[:, :C] = 1.0  # Conv1D (in, 3C): Q columns
    t2 = QKVGradTracker()
    t2(5, hf)
    r2 = {row["layer"]: row for row in t2.rows}
    assert r2[0]["q"] == pytest.approx(float(C)) and r2[0]["k"] == 0.0 and r2[0]["v"] == 0.0


def test_llama_style_separate_projections():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=40,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    m = LlamaForCausalLM(cfg)
    out = m(torch.randint(0, 40, (2, 8)), labels=torch.randint(0, 40, (2, 8)))
    out.loss.backward()
    t = QKVGradTracker()
    t(0, m)
    rows = t.rows
    assert len(rows) == 2 and all(r["q"] > 0 and r["k"] > 0 and r["v"] > 0 for r in rows)
    expect_k = float(m.model.layers[0].self_attn.k_proj.weight.grad.norm())
    assert rows[0]["k"] == pytest.approx(expect_k, rel=1e-6)


def test_errors():
    with pytest.raises(ValueError, match="no gradients"):
        QKVGradTracker().save("/tmp/never")
    with pytest.raises(ValueError, match="no attention module"):
        QKVGradTracker()(0, torch.nn.Linear(2, 2))
