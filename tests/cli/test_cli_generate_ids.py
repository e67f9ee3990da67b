"""Issue #29: ``generate`` on a model without a tokenizer takes ``--ids`` (the error that says "pass token ids
instead" names a flag that exists); ids outside the vocabulary are refused with the limit named."""

from __future__ import annotations

import json

import pytest
import torch

from genprobe.cli import build_parser, main


@pytest.fixture(scope="module")
def notok_dir(tmp_path_factory):
    """A transformers GPT-2 directory with weights and config only: no tokenizer files."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=50,
        n_positions=32,
        n_embd=32,
        n_layer=2,
        n_head=2,
        n_inner=64,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
    )
    d = tmp_path_factory.mktemp("hf") / "gpt2-notok"
    GPT2LMHeadModel(cfg).save_pretrained(d, safe_serialization=True)
    return d


def test_each_ids_flag_is_one_prompt():
    args = build_parser().parse_args(["generate", "M", "--ids", "1", "2", "--ids", "3"])
    assert args.ids == [[1, 2], [3]] and not args.prompt


def test_text_on_a_model_without_tokenizer_names_the_ids_flag(notok_dir, capsys):
    assert main(["generate", str(notok_dir), "--prompt", "hello"]) == 2
    err = capsys.readouterr().err
    assert "has no tokenizer" in err and "--ids" in err


def test_generate_ids_without_tokenizer_prints_ids(notok_dir, capsys):
    assert main(["generate", str(notok_dir), "--ids", "5", "6", "7", "--max-new-tokens", "4"]) == 0
    out = capsys.readouterr().out.split()
    assert len(out) == 4 and all(0 <= int(t) < 50 for t in out)
    assert (
        main(["generate", str(notok_dir), "--ids", "5", "6", "7", "--ids", "8", "--max-new-tokens", "4", "--json"]) == 0
    )
    d = json.loads(capsys.readouterr().out)
    assert [r["prompt_tokens"] for r in d["results"]] == [[5, 6, 7], [8]]
    for r in d["results"]:
        assert r["text"] is None and r["prompt"] is None and len(r["tokens"]) == 4
    assert main(["generate", str(notok_dir), "--ids", "5", "6", "7", "--max-new-tokens", "4", "--json"]) == 0
    assert [int(t) for t in out] == json.loads(capsys.readouterr().out)["tokens"]  # same seed: the same ids


@pytest.mark.parametrize("bad", ["50", "-1"])
def test_ids_outside_the_vocabulary_are_refused_naming_the_limit(notok_dir, capsys, bad):
    assert main(["generate", str(notok_dir), "--ids", "5", bad]) == 2
    err = capsys.readouterr().err
    assert f"token id {bad} is outside" in err and "[0, 50)" in err and "at most 49" in err


def test_ids_with_a_tokenizer_also_give_text(trained_ckpt, capsys):
    from genprobe.model.load import load_model

    tok = load_model(trained_ckpt).tokenizer
    ids = tok.encode("白日依山")
    assert main(["generate", str(trained_ckpt), "--ids", *map(str, ids), "--max-new-tokens", "5", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["prompt_tokens"] == ids and d["prompt"] == "白日依山"
    assert d["text"] == tok.decode(d["tokens"]) and len(d["tokens"]) == 5
    assert main(["generate", str(trained_ckpt), "--ids", *map(str, ids), "--chat"]) == 2
    assert "--chat" in capsys.readouterr().err
