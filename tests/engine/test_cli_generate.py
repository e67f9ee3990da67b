"""``genprobe generate`` end to end on a tiny checkpoint (and its HF export)."""

from __future__ import annotations

import json
import warnings

import pytest

from genprobe._io import json_safe
from genprobe.cli import main


@pytest.fixture
def tiny_ckpt(tmp_path, tiny_model):
    from genprobe.corpus.tokenizer import CharTokenizer
    from genprobe.model.checkpoint import save_checkpoint

    tok = CharTokenizer([chr(0x4E00 + i) for i in range(48)])
    return save_checkpoint(tmp_path / "ck", tiny_model, tok), tok


def test_cli_generate_streams_text_and_json(tiny_ckpt, capsys):
    ck, tok = tiny_ckpt
    prompt = tok.chars[3] + tok.chars[4]
    assert main(["generate", str(ck), "--prompt", prompt, "--greedy", "--max-new-tokens", "6"]) == 0
    streamed = capsys.readouterr().out
    assert streamed.startswith(prompt)
    assert main(["generate", str(ck), "--prompt", prompt, "--greedy", "--max-new-tokens", "6", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert len(d["tokens"]) == 6 and d["sampler"]["greedy"] is True
    assert streamed.strip() == prompt + d["text"]
    assert all(0 <= s["prob"] <= 1 and s["entropy_nats"] >= 0 for s in d["steps"])


def test_cli_generate_warns_about_unknown_prompt_chars_and_bans_unk(tiny_ckpt, capsys):
    ck, tok = tiny_ckpt
    rc = main(
        [
            "generate",
            str(ck),
            "--prompt",
            tok.chars[1] + "连",
            "--ban-unk",
            "--temperature",
            "1.2",
            "--top-p",
            "0.9",
            "--max-new-tokens",
            "20",
            "--seed",
            "3",
            "--json",
        ]
    )
    assert rc == 0
    cap = capsys.readouterr()
    assert "连" in cap.err and "<unk>" in cap.err
    d = json.loads(cap.out)
    assert d["unknown_prompt_chars"] == ["连"] and 1 not in d["tokens"]


def test_cli_generate_top_table(tiny_ckpt, capsys):
    ck, tok = tiny_ckpt
    argv = ["generate", str(ck), "--prompt", tok.chars[2], "--top", "3", "--max-new-tokens", "4", "--seed", "1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("step ") == 4 and "H=" in out and "kept=" in out


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--top-p", "1.5"], "top_p"),
        (["--temperature", "0"], "temperature"),
        (["--max-new-tokens", "40"], "context length 32"),
    ],
)
def test_cli_generate_bad_input_exits_2(tiny_ckpt, capsys, extra, needle):
    ck, tok = tiny_ckpt
    assert main(["generate", str(ck), "--prompt", tok.chars[2]] + extra) == 2
    assert needle in capsys.readouterr().err


def test_cli_generate_from_hf_dir(tmp_path, tiny_ckpt, tiny_model, capsys):
    from genprobe.model.hf import to_hf_gpt2

    ck, tok = tiny_ckpt
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        to_hf_gpt2(tiny_model).save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "genprobe_tokenizer.json").write_text(json.dumps(json_safe(tok)), encoding="utf-8")
    args = ["--prompt", tok.chars[5] + tok.chars[6], "--greedy", "--max-new-tokens", "8", "--json"]
    assert main(["generate", str(ck)] + args) == 0
    a = json.loads(capsys.readouterr().out)
    assert main(["generate", str(tmp_path / "hf")] + args) == 0
    b = json.loads(capsys.readouterr().out)
    assert a["tokens"] == b["tokens"]


def test_cli_generate_compile_flag_gives_the_same_text(tiny_ckpt, capsys):
    ck, tok = tiny_ckpt
    args = ["generate", str(ck), "--prompt", tok.chars[3] + tok.chars[4], "--greedy", "--max-new-tokens", "8", "--json"]
    assert main(args) == 0
    eager = json.loads(capsys.readouterr().out)
    assert main(args + ["--compile"]) == 0
    compiled = json.loads(capsys.readouterr().out)
    assert compiled["tokens"] == eager["tokens"] and compiled["text"] == eager["text"]


def test_cli_generate_batch_from_prompt_list_and_file(tiny_ckpt, tmp_path, capsys):
    ck, tok = tiny_ckpt
    p1, p2 = tok.chars[3] + tok.chars[4], tok.chars[7]
    assert main(["generate", str(ck), "--prompt", p1, p2, "--greedy", "--max-new-tokens", "5", "--json"]) == 0
    batch = json.loads(capsys.readouterr().out)["results"]
    assert [r["prompt"] for r in batch] == [p1, p2] and all(len(r["tokens"]) == 5 for r in batch)
    f = tmp_path / "prompts.txt"
    f.write_text(p2 + "\n", encoding="utf-8")
    assert main(["generate", str(ck), "--prompts", str(f), "--greedy", "--max-new-tokens", "5", "--json"]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert alone["tokens"] == batch[1]["tokens"]  # a left-padded row equals the prompt alone


def test_cli_generate_needs_a_prompt_and_refuses_an_empty_one(tiny_ckpt, capsys):
    ck, _ = tiny_ckpt
    with pytest.raises(SystemExit):
        main(["generate", str(ck)])
    assert main(["generate", str(ck), "--prompt", ""]) == 2
    assert "empty prompt" in capsys.readouterr().err
