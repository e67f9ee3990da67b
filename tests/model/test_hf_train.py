"""Subword trainer (genprobe.model.hf_train) + directory writer (save_subword_dir), tiny settings.

The written directory must be what transformers' public API loads offline (``AutoModelForCausalLM`` /
``AutoTokenizer.from_pretrained(..., local_files_only=True)``) with logits equal to the in-memory model's.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch

from genprobe._io import json_safe, read_format_json
from genprobe.corpus import bpe
from genprobe.corpus.tang import bundled_documents, corpus_split, split_texts
from genprobe.model import hf_train
from genprobe.model.hf_train import SUMMARY_FILE, SUMMARY_FORMAT, save_subword_dir
from genprobe.model.load import load_model

pytestmark = pytest.mark.slow  # trains small models (≈ 30 s of CPU in all)

FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    SUMMARY_FILE,
}


@pytest.fixture(scope="module")
def data():
    docs = bundled_documents()[:3000]
    split = corpus_split(docs, subword_poems=2000, char_poems=1500)
    return split, split_texts(docs, split)


def _train(data, arch="llama", samples=0, **tc):
    split, texts = data
    cfg = hf_train.quick_model_config(arch)
    return hf_train.train_subword(
        texts,
        split,
        cfg,
        replace(hf_train.quick_train_config(), **tc),
        progress=False,
        heldout_docs=50,
        samples=samples,
    )


@pytest.fixture(scope="module")
def small():
    """A smaller split for the runs that only compare weights or load paths (cheap final evaluation)."""
    docs = bundled_documents()[:900]
    split = corpus_split(docs, subword_poems=700, char_poems=400)
    return split, split_texts(docs, split)


@pytest.fixture(scope="module")
def run(data):
    return _train(data, samples=2)


@pytest.fixture(scope="module")
def saved(run, tmp_path_factory):
    out = tmp_path_factory.mktemp("sub") / "model"
    save_subword_dir(out, run.model, run.tokenizer, run.summary)
    return out


def test_model_is_a_gqa_swiglu_llama(run):
    from transformers import LlamaForCausalLM

    m = run.model
    assert isinstance(m, LlamaForCausalLM)
    assert m.config.num_key_value_heads < m.config.num_attention_heads
    mlp = m.model.layers[0].mlp
    assert {"gate_proj", "up_proj", "down_proj"} <= {n for n, _ in mlp.named_children()}
    assert m.config.eos_token_id == bpe.eos_id(run.tokenizer) == 0


def test_loss_decreases(run):
    s = run.summary
    assert s["initial_loss"] == pytest.approx(math.log(512), abs=0.3)  # untrained: ≈ uniform over the vocabulary
    assert s["val_loss"] < s["initial_loss"] - 0.8 and s["train_loss"] < s["initial_loss"] - 0.8


def test_samples_continue_held_out_openings(run, data):
    """Greedy samples of the first held-out openings: as trained, and with end-of-text suppressed."""
    s = run.summary["samples"]
    assert [x["prompt"] for x in s] == [d[:5] for d in data[1].heldout[:2]]
    assert all(x["greedy_no_eos"] and bpe.EOS_TOKEN not in x["greedy_no_eos"] for x in s)


def test_summary_figures_are_consistent(run, data):
    s, (_, texts) = run.summary, data
    v = s["val"]
    assert v["chars"] == len(texts.char_val_text)
    assert s["val_bits_per_char"] == pytest.approx(v["nats"] / math.log(2) / v["chars"], abs=1e-3)
    assert s["val_loss"] == pytest.approx(v["nats"] / v["tokens"], abs=1e-3)
    # every token of <eos> d0 <eos> ... <eos> after the first is a target
    n_tokens = sum(len(i) for i in bpe.encode_batch(run.tokenizer, texts.char_val_documents))
    assert v["tokens"] == n_tokens + len(texts.char_val_documents)
    assert s["split"] == json_safe(data[0]) and s["split"]["subword_train"][1] == [1500, 2000]
    assert s["parameters"] == sum(p.numel() for p in run.model.parameters())


def test_directory_loads_offline_with_identical_logits(run, saved, data):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert {p.name for p in saved.iterdir()} == FILES
    model = AutoModelForCausalLM.from_pretrained(saved, local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(saved, local_files_only=True)
    assert type(model) is type(run.model) and model.dtype == torch.float32
    poems = data[1].heldout[:20]
    assert [tok.encode(p) for p in poems] == bpe.encode_batch(run.tokenizer, poems)
    assert [tok.decode(tok.encode(p)) for p in poems] == poems
    x = torch.tensor([bpe.stream_ids(run.tokenizer, poems[:2])])
    with torch.no_grad():
        assert torch.equal(model(input_ids=x).logits, run.model.eval()(input_ids=x).logits)
    assert read_format_json(saved / SUMMARY_FILE, SUMMARY_FORMAT)["val_loss"] == run.summary["val_loss"]
    assert json.loads((saved / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    cfg = json.loads((saved / "config.json").read_text())
    assert cfg["max_position_embeddings"] == 64 and cfg["tie_word_embeddings"] is True


def test_greedy_generation_stops_at_end_of_text(saved):
    """generation_config carries eos/pad, so generate() needs no extra arguments."""
    loaded = load_model(saved)
    model, tok = loaded.module, loaded.tokenizer
    x = torch.tensor([tok.encode("春風")])
    out = model.generate(x, max_new_tokens=8, do_sample=False)
    assert out.shape[1] <= x.shape[1] + 8 and model.generation_config.eos_token_id == 0


def test_same_seed_same_weights(small):
    again = _train(small, steps=5)
    twice = _train(small, steps=5)
    assert again.tokenizer.to_str() == twice.tokenizer.to_str()
    sa, sb = again.model.state_dict(), twice.model.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    other = _train(small, steps=5, seed=1).model.state_dict()
    assert not all(torch.equal(sa[k], other[k]) for k in sa)


def test_qwen2_arch_round_trip(small, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2ForCausalLM

    data = small
    r = _train(data, arch="qwen2", steps=3)
    save_subword_dir(tmp_path / "q", r.model, r.tokenizer, r.summary)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "q", local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(tmp_path / "q", local_files_only=True)
    assert isinstance(model, Qwen2ForCausalLM) and model.model.layers[0].self_attn.q_proj.bias is not None
    poems = data[1].heldout[:20]
    assert [tok.encode(p) for p in poems] == bpe.encode_batch(r.tokenizer, poems)
    x = torch.tensor([bpe.stream_ids(r.tokenizer, poems[:2])])
    with torch.no_grad():
        assert torch.equal(model(input_ids=x).logits, r.model.eval()(input_ids=x).logits)


def test_writer_refuses_foreign_directories_and_replaces_its_own(run, saved, tmp_path, monkeypatch):
    foreign = tmp_path / "thesis"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("precious", encoding="utf-8")
    with pytest.raises(ValueError, match="not a genprobe-trained model"):
        save_subword_dir(foreign, run.model, run.tokenizer, run.summary)
    assert [p.name for p in foreign.iterdir()] == ["thesis.tex"]
    # a failure half-way leaves the previous model in place and no temporary directory behind
    before = (saved / "model.safetensors").read_bytes()

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(bpe, "to_hf_tokenizer", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        save_subword_dir(saved, run.model, run.tokenizer, run.summary)
    assert (saved / "model.safetensors").read_bytes() == before and {p.name for p in saved.iterdir()} == FILES
    assert [p.name for p in saved.parent.iterdir()] == [saved.name]


def test_bad_model_config_values():
    with pytest.raises(ValueError, match=r"\[257, 65536\]"):
        hf_train.SubwordModelConfig(vocab_size=100)
    with pytest.raises(ValueError, match="multiple of n_kv_head"):
        hf_train.SubwordModelConfig(d_model=192, n_head=6, n_kv_head=4)
    with pytest.raises(ValueError, match="arch must be one of"):
        hf_train.SubwordModelConfig(arch="gpt2")
    with pytest.raises(ValueError, match="block_size must be >= 8"):
        hf_train.SubwordModelConfig(block_size=4)
    with pytest.raises(ValueError, match="even size"):
        hf_train.SubwordModelConfig(d_model=18, n_head=6, n_kv_head=2)


def test_the_one_loader_reads_the_directory(run, saved):
    """genprobe.model.load.load_model detects a transformers directory and finds the SwiGLU down-projections."""
    from genprobe.model.load import load_model

    m = load_model(saved)
    assert (m.kind, m.arch, m.vocab_size, m.max_positions) == ("hf", "llama", 512, 64)
    assert (m.eos_id, m.pad_id, m.unk_id, m.tokenizer.kind) == (0, 0, None, "subword")
    text = "春眠不覺曉，處處聞啼鳥。😀"
    assert m.encode(text) == run.tokenizer.encode(text).ids and m.decode(m.encode(text)) == text
    assert m.tokenizer.unknown_chars(text) == []
    assert [s.weight_name for s in m.mlp_sites()] == [f"model.layers.{i}.mlp.down_proj.weight" for i in range(2)]
