"""Every sampler flag through ``genprobe generate`` (one shared definition: genprobe.cli._sampler_args)."""

from __future__ import annotations

import argparse
import json

import pytest

from genprobe.cli import main
from genprobe.cli._sampler_args import add_sampler_arguments, sampler_from_args, unescape


@pytest.fixture
def tiny_ckpt(tmp_path, tiny_model):
    from genprobe.corpus.tokenizer import CharTokenizer
    from genprobe.model.checkpoint import save_checkpoint

    tok = CharTokenizer([chr(0x4E00 + i) for i in range(47)] + ["，"])
    return save_checkpoint(tmp_path / "ck", tiny_model, tok), tok


def _run(capsys, ck, tok, *flags):
    rc = main(["generate", str(ck), "--prompt", tok.chars[3] + tok.chars[4], "--max-new-tokens", "8", "--json", *flags])
    cap = capsys.readouterr()
    return rc, (json.loads(cap.out) if rc == 0 else cap.err)


def test_every_new_parameter_reaches_the_json(tiny_ckpt, capsys):
    ck, tok = tiny_ckpt
    rc, d = _run(
        capsys,
        ck,
        tok,
        "--dry-multiplier",
        "0.8",
        "--dry-base",
        "1.5",
        "--dry-allowed-length",
        "3",
        "--dry-last-n",
        "32",
        "--dry-sequence-breakers",
        "，",
        "--xtc-probability",
        "0.5",
        "--xtc-threshold",
        "0.2",
        "--typical-p",
        "0.9",
        "--top-n-sigma",
        "2",
        "--penalty-last-n",
        "16",
        "--repetition-penalty",
        "1.1",
        "--engine",
        "llama.cpp",
        "--seed",
        "4",
    )
    assert rc == 0, d
    s = d["sampler"]
    assert (s["dry_multiplier"], s["dry_base"], s["dry_allowed_length"], s["dry_last_n"]) == (0.8, 1.5, 3, 32)
    assert s["dry_sequence_breakers"] == [[tok.encode("，")[0]]]
    assert (s["xtc_probability"], s["xtc_threshold"], s["typical_p"], s["top_n_sigma"]) == (0.5, 0.2, 0.9, 2.0)
    assert (s["penalty_last_n"], s["engine"], s["order"]) == (16, "llama.cpp", "trunc_then_temp")
    assert len(d["tokens"]) == 8


def test_preset_defaults_and_overrides(tiny_ckpt, capsys):
    ck, tok = tiny_ckpt
    rc, d = _run(capsys, ck, tok, "--preset", "llama.cpp")
    assert rc == 0 and (d["sampler"]["top_k"], d["sampler"]["temperature"], d["sampler"]["min_p"]) == (40, 0.8, 0.05)
    rc, d = _run(capsys, ck, tok, "--preset", "llama.cpp", "--top-k", "5", "--order", "hf")
    assert rc == 0 and d["sampler"]["top_k"] == 5 and d["sampler"]["order"] == "hf"
    assert d["sampler"]["engine"] == "llama.cpp"
    rc, d = _run(capsys, ck, tok, "--preset", "hf")
    assert rc == 0 and d["sampler"]["top_k"] == 50


def test_contrastive_search_from_the_cli_equals_the_library(tiny_ckpt, tiny_model, capsys):
    from genprobe.engine.generate import generate
    from genprobe.engine.samplers.stages import SamplerConfig

    ck, tok = tiny_ckpt
    rc, d = _run(capsys, ck, tok, "--penalty-alpha", "0.6", "--top-k", "4")
    assert rc == 0 and d["sampler"]["penalty_alpha"] == 0.6
    ids = tok.encode(tok.chars[3] + tok.chars[4])
    assert d["tokens"] == generate(tiny_model, [ids], 8, sampler=SamplerConfig(penalty_alpha=0.6, top_k=4)).tokens[0]


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--dry-multiplier", "1", "--dry-base", "0.5"], "dry_base must be >= 1"),
        (["--xtc-probability", "0.5", "--xtc-threshold", "1.5"], "xtc_threshold must be in [0, 1]"),
        (["--typical-p", "0"], "typical_p must be in (0, 1]"),
        (["--penalty-alpha", "0.6"], "top_k >= 2"),
        (["--top-n-sigma", "-1"], "top_n_sigma must be >= 0"),
        (["--penalty-last-n", "-2"], "penalty_last_n must be an integer >= -1"),
        (["--order", "hf", "--penalty-last-n", "8", "--repetition-penalty", "1.2"], "no penalty window"),
        (["--dry-multiplier", "0.5", "--dry-allowed-length", "0"], "dry_allowed_length must be an integer >= 1"),
    ],
)
def test_bad_sampler_flags_exit_2_naming_the_limit(tiny_ckpt, capsys, flags, needle):
    ck, tok = tiny_ckpt
    rc, err = _run(capsys, ck, tok, *flags)
    assert rc == 2 and needle in err


def test_sampler_from_args_defaults_are_plain_sampling_and_breakers_default_to_llama_cpp():
    p = argparse.ArgumentParser()
    add_sampler_arguments(p)
    from genprobe.engine.samplers.stages import SamplerConfig

    assert sampler_from_args(p.parse_args([])) == SamplerConfig()

    class Tok:
        vocab_size, unk_id = 4, 1
        chars = ["<pad>", "<unk>", "\n", ":"]

        def token_str(self, i):
            return self.chars[i]

        def encode(self, s, warn=True):
            return [self.chars.index(c) for c in s]

    cfg = sampler_from_args(p.parse_args(["--dry-multiplier", "0.8", "--ban-unk"]), Tok())
    assert set(cfg.dry_sequence_breakers) == {(2,), (3,)} and cfg.ban_ids == (1,)  # "\n" and ":" exist here
    none = sampler_from_args(p.parse_args(["--dry-multiplier", "0.8", "--dry-sequence-breakers", "none"]), Tok())
    assert none.dry_sequence_breakers == ()
    assert unescape(r"\n") == "\n" and unescape(r"a\\b") == "a\\b" and unescape("，") == "，"
