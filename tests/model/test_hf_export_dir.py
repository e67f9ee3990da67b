"""HF directory export/import: from_pretrained loads it offline, logits match, the round trip is exact."""

from __future__ import annotations

import pickle

import pytest
import torch

from genprobe.corpus.tokenizer import CharTokenizer
from genprobe.model.checkpoint import save_checkpoint
from genprobe.model.config import GPTConfig
from genprobe.model.gpt import GPT
from genprobe.model.hf_dir import export_hf_dir, import_hf_dir
from genprobe.model.load import TOKENIZER_FILE

PROMPTS = [
    "春眠不覺曉",
    "床前明月光，疑是地上霜。舉頭望明月，低頭思故鄉。",
    "白日依山盡黃河入海流欲窮千里目更上一層樓" * 3,
]


@pytest.fixture(scope="module")
def tok() -> CharTokenizer:
    return CharTokenizer.from_text("".join(PROMPTS) + " \n", 200)


def _loud_model(tok: CharTokenizer, pe: str = "learned") -> GPT:
    """Default-shaped GPT with large random weights, so logits span several nats (a 1e-5 check means something)."""
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=tok.vocab_size, pos_encoding=pe))
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * (0.15 if p.dim() >= 2 else 0.05))
    return m.eval()


@pytest.fixture(scope="module")
def exported(tok, tmp_path_factory):
    m = _loud_model(tok)
    ck = save_checkpoint(tmp_path_factory.mktemp("ck") / "ck", m, tok)
    out = tmp_path_factory.mktemp("hf") / "hf"
    res = export_hf_dir(ck, out)
    return m, out, res


def test_from_pretrained_logits_match_within_1e5(exported, tok):
    from transformers import GPT2LMHeadModel

    m, out, res = exported
    assert {"config.json", "model.safetensors", TOKENIZER_FILE, "tokenizer.json"} <= set(res["files"])
    hf = GPT2LMHeadModel.from_pretrained(out, local_files_only=True).eval()
    spread = []
    with torch.no_grad():
        for text in PROMPTS:
            ids = torch.tensor([tok.encode(text, warn=False)[: m.cfg.block_size]])
            ours, theirs = m(ids), hf(ids).logits
            assert (ours - theirs).abs().max() < 1e-5, text
            spread.append(float(ours.std()))
    assert min(spread) > 0.5  # logits are far from zero, so the comparison is not vacuous


def test_auto_tokenizer_matches_ours(exported, tok):
    from transformers import AutoTokenizer

    _, out, _ = exported
    hf_tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    for text in PROMPTS + ["春江潮水连海平 x\n"]:  # 连 and x are not in the vocabulary -> <unk> = 1
        ours = tok.encode(text, warn=False)
        assert hf_tok(text, add_special_tokens=False)["input_ids"] == ours
    assert hf_tok.decode(tok.encode(PROMPTS[1], warn=False)) == PROMPTS[1]
    assert hf_tok.unk_token_id == 1 and hf_tok.pad_token_id == 0


def test_import_round_trip_is_exact(exported, tok):
    m, out, _ = exported
    m2, tok2 = import_hf_dir(out)
    sa, sb = m.state_dict(), m2.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert m2.cfg == m.cfg
    assert tok2.fingerprint == tok.fingerprint


def test_import_falls_back_to_tokenizer_json(exported, tok, tmp_path):
    import shutil

    _, out, _ = exported
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    (copy / TOKENIZER_FILE).unlink()
    _, tok2 = import_hf_dir(copy)
    assert tok2.fingerprint == tok.fingerprint


def test_export_refuses_non_learned_positions(tok, tmp_path):
    with pytest.raises(ValueError, match="pos_encoding='learned'.*'rope'"):
        export_hf_dir(_loud_model(tok, "rope"), tmp_path / "x", tokenizer=tok)
    assert not (tmp_path / "x").exists()


def test_export_refuses_non_empty_target_unless_overwrite(exported, tok, tmp_path):
    m, _, _ = exported
    out = tmp_path / "busy"
    out.mkdir()
    (out / "keep.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(ValueError, match="not empty"):
        export_hf_dir(m, out, tokenizer=tok)
    assert (out / "keep.txt").read_text(encoding="utf-8") == "mine"
    export_hf_dir(m, out, tokenizer=tok, overwrite=True)
    assert not (out / "keep.txt").exists() and (out / "model.safetensors").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left behind


def test_import_never_unpickles(exported, tmp_path, monkeypatch):
    import shutil

    _, out, _ = exported
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    marker = tmp_path / "UNPICKLED"

    class Bomb:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    (copy / "pytorch_model.bin").write_bytes(pickle.dumps(Bomb()))

    def forbidden(*a, **k):
        raise AssertionError("import must never unpickle")

    monkeypatch.setattr(torch, "load", forbidden)
    import_hf_dir(copy)
    assert not marker.exists()
    (copy / "model.safetensors").unlink()  # only a pickle left: refused, not loaded
    with pytest.raises(ValueError, match="safetensors only"):
        import_hf_dir(copy)
    assert not marker.exists()


def test_import_bad_input(exported, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    with pytest.raises(FileNotFoundError, match="no such model directory"):
        import_hf_dir(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="config.json"):
        import_hf_dir(tmp_path / "empty")
    # a loadable transformers model that is not GPT-2, with the char vocabulary beside it: refused by its model_type
    llama = LlamaConfig(num_hidden_layers=1, hidden_size=16, intermediate_size=32, num_attention_heads=2, vocab_size=99)
    LlamaForCausalLM(llama).save_pretrained(tmp_path / "llama")
    (tmp_path / "llama" / TOKENIZER_FILE).write_text((exported[1] / TOKENIZER_FILE).read_text("utf-8"), "utf-8")
    with pytest.raises(ValueError, match="model_type 'llama'"):
        import_hf_dir(tmp_path / "llama")
