"""``genprobe loops`` on the user's own model: prompt files, validation text, end token, apply/revert on a
transformers directory; the CLI grammar (MODEL positional)."""

import json

import pytest
import torch

from genprobe._io import sha256_file
from genprobe.cli import main
from genprobe.corpus.inputs import read_prompt_file, split_prompts
from genprobe.loops.patch import EditSpec, finalise, load_patch, make_patch, save_patch
from genprobe.model.arch import state_sha256
from genprobe.model.load import load_model

from .conftest import POEM, save_tiny_qwen2


@pytest.fixture(autouse=True)
def _single_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def hf_dir(tmp_path):
    """A tiny random Qwen2 with a byte-level BPE (end-of-text id 0), saved as a transformers directory."""
    return save_tiny_qwen2(tmp_path / "qwen")


@pytest.fixture
def prompt_file(tmp_path):
    p = tmp_path / "prompts.jsonl"
    lines = [json.dumps({"prompt": POEM[i : i + 5]}, ensure_ascii=False) for i in range(0, 40, 2)]
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


# ---- prompt files and sets -------------------------------------------------------------------
def test_read_prompt_file_lines_jsonl_and_errors(tmp_path):
    (tmp_path / "a.txt").write_text("床前明月光\n\n  疑是地上霜  \n", encoding="utf-8")
    assert read_prompt_file(tmp_path / "a.txt") == ["床前明月光", "疑是地上霜"]
    (tmp_path / "b.jsonl").write_text('{"prompt": "床前"}\n{"text": "明月"}\n"舉頭"\n', encoding="utf-8")
    assert read_prompt_file(tmp_path / "b.jsonl") == ["床前", "明月", "舉頭"]
    (tmp_path / "c.json").write_text('{"text": "a"}\n{"text": "b"}\n', encoding="utf-8")  # every line an object
    assert read_prompt_file(tmp_path / "c.json") == ["a", "b"]
    (tmp_path / "empty.txt").write_text("\n  \n", encoding="utf-8")
    with pytest.raises(ValueError, match="empty"):
        read_prompt_file(tmp_path / "empty.txt")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a"}\n{"title": "b"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="line 2 has neither a 'prompt' nor a 'text'"):
        read_prompt_file(tmp_path / "bad.jsonl")
    (tmp_path / "blank.jsonl").write_text('{"prompt": "a"}\n{"prompt": " "}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="line 2 holds an empty prompt"):
        read_prompt_file(tmp_path / "blank.jsonl")
    with pytest.raises(FileNotFoundError):
        read_prompt_file(tmp_path / "missing.txt")


def test_split_prompts_disjoint_deterministic_and_order_free():
    prompts = [f"prompt {i}" for i in range(100)] + ["prompt 3"]  # a duplicate is used once
    sizes = {"direction": 768, "search": 1024, "validate": 1024}
    a = split_prompts(prompts, sizes)
    b = split_prompts(list(reversed(prompts)), sizes)
    assert a == b  # the file's order does not matter
    flat = a["direction"] + a["search"] + a["validate"]
    assert len(flat) == len(set(flat)) and set(flat) <= set(prompts)
    assert [len(a[k]) for k in sizes] == [27, 36, 36]  # proportional to 768 : 1024 : 1024
    small = split_prompts(prompts, {"direction": 10, "search": 5, "validate": 5})
    assert [len(small[k]) for k in ("direction", "search", "validate")] == [10, 5, 5]  # capped at the sizes
    with pytest.raises(ValueError, match="2 distinct prompt.*3 disjoint sets"):
        split_prompts(["a", "b", "a"], sizes)


# ---- scan on the user's model ----------------------------------------------------------------
def test_scan_hf_model_needs_explicit_prompts(hf_dir, capsys):
    assert main(["loops", "scan", str(hf_dir)]) == 2
    err = capsys.readouterr().err
    assert "not the bundled character model" in err and "--prompts FILE" in err and "--tang-prompts" in err


def test_scan_compile_is_for_genprobes_engine_and_vllm(prompt_file, capsys, tmp_path):
    gguf = tmp_path / "model.gguf"  # llama.cpp's kind of MODEL: the --compile refusal comes before anything loads
    gguf.write_bytes(b"")
    args = ["loops", "scan", str(gguf), "--prompts", str(prompt_file), "--compile", "--backend", "llama.cpp"]
    assert main(args) == 2
    assert "--compile is for genprobe's engine (its compiled fast path) and vLLM" in capsys.readouterr().err


def test_scan_hf_model_bans_end_token_and_reports_chars(hf_dir, prompt_file, capsys, tmp_path):
    assert (
        main(
            [
                "loops",
                "scan",
                str(hf_dir),
                "--prompts",
                str(prompt_file),
                "--max-new-tokens",
                "24",
                "--setting",
                "chanting",
                "--json",
                "--out",
                str(tmp_path / "scan"),
            ]
        )
        == 0
    )
    cap = capsys.readouterr()
    out = json.loads(cap.out)
    assert "note: the end-of-text token (id 0) is banned" in cap.err
    assert out["end_token"] == {"id": 0, "banned": True, "note": out["end_token"]["note"]}
    s = out["scans"]["chanting"]
    assert s["settings"]["eos_banned"] and s["summary"]["n"] == 20
    for key in (
        "loop_rate",
        "near_loop_rate",
        "any_loop_rate",
        "repetitive_rate",
        "degenerate_rate",
        "mean_tail_compression",
        "mean_seq_rep_4",
    ):
        assert key in s["summary"] and key in s["summary"]["chars"]  # tokens and characters side by side
    recs = json.loads((tmp_path / "scan" / "scan.json").read_text(encoding="utf-8"))["scans"]["chanting"]["records"]
    assert all(len(r["tokens"]) == 24 and 0 not in r["tokens"] for r in recs)
    assert all(r["chars"]["length"] == len(r["text"]) for r in recs)


def test_repair_val_text_shorter_than_a_window(hf_dir, prompt_file, tmp_path, capsys):
    short = tmp_path / "val.txt"
    short.write_text(POEM[:10], encoding="utf-8")
    assert (
        main(
            [
                "loops",
                "repair",
                str(hf_dir),
                "--prompts",
                str(prompt_file),
                "--val-text",
                str(short),
                "--out",
                str(tmp_path / "r"),
                "--max-new-tokens",
                "24",
                "--ks",
                "4",
                "--subtract-alphas",
                "1",
                "--project-alphas",
                "1",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "shorter than one regression window of 64 tokens" in err
    assert main(["loops", "repair", str(hf_dir), "--prompts", str(prompt_file), "--out", str(tmp_path / "r")]) == 2
    assert "--val-text FILE" in capsys.readouterr().err  # no silent Tang default for a user's model


@pytest.mark.slow
def test_repair_apply_revert_on_a_transformers_dir(hf_dir, prompt_file, tmp_path, capsys):
    """The whole workflow on a user's model: repair with their prompts and text, apply the patch to a copy of the
    directory that from_pretrained loads, revert it to the original file bit for bit."""
    val = tmp_path / "val.txt"
    val.write_text(POEM * 8, encoding="utf-8")
    rc = main(
        [
            "loops",
            "repair",
            str(hf_dir),
            "--prompts",
            str(prompt_file),
            "--val-text",
            str(val),
            "--val-window",
            "32",
            "--out",
            str(tmp_path / "r"),
            "--max-new-tokens",
            "24",
            "--ks",
            "4",
            "--subtract-alphas",
            "0.5",
            "1",
            "--project-alphas",
            "1",
            "--max-kl",
            "10",
            "--max-dloss",
            "10",
            "--json",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    rep = json.loads((tmp_path / "r" / "repair.json").read_text(encoding="utf-8"))
    assert out["end_token"]["banned"] and rep["inputs"]["prompt_source"].startswith("file:")
    sets = [set(rep["inputs"][k]["first"]) for k in ("direction", "search", "validate")]
    assert not (sets[0] & sets[1] or sets[1] & sets[2] or sets[0] & sets[2])
    patch_json = tmp_path / "r" / "patch.json"
    if out["patch"] is None:  # a held-out change too small to be significant: the verdict says so, nothing written
        assert out["verdict"].endswith(": no patch") and not patch_json.exists(), out["verdict"]
        patch_json = _random_patch(hf_dir, tmp_path / "p")  # the rest of the workflow on a patch of the same form
    meta = load_patch(patch_json).meta
    assert main(["loops", "apply", str(hf_dir), str(patch_json), "--out", str(tmp_path / "patched"), "--json"]) == 0
    applied = json.loads(capsys.readouterr().out)
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(tmp_path / "patched", local_files_only=True)  # loads as a plain HF dir
    assert load_model(tmp_path / "patched").state_sha256() == applied["state_sha256"] == meta["sha256_after"]
    assert (
        main(["loops", "revert", str(tmp_path / "patched"), str(patch_json), "--out", str(tmp_path / "back"), "--json"])
        == 0
    )
    back = json.loads(capsys.readouterr().out)
    assert back["matches_original"] is True and back["state_sha256"] == meta["sha256_before"]
    assert sha256_file(tmp_path / "back" / "model.safetensors") == sha256_file(hf_dir / "model.safetensors")


def _random_patch(model_dir, path):
    """A loop patch of random directions on every layer of the model in ``model_dir`` (as `loops repair` writes)."""
    from genprobe.model.arch import mlp_sites

    module = load_model(model_dir).module
    gen = torch.Generator().manual_seed(0)
    sites = mlp_sites(module)
    dirs = {i: torch.randn(s.d_model, generator=gen) for i, s in enumerate(sites)}
    patch = make_patch(
        module, EditSpec(tuple(dirs), 4, "subtract", 0.5), dirs, {i: torch.ones(s.d_ff) for i, s in enumerate(sites)}
    )
    finalise(module, patch)
    return save_patch(patch, path)[1]


# ---- the genprobe checkpoint path and the grammar ---------------------------------------------
def test_cli_apply_revert_roundtrip_and_refusal(tiny_cfg, corpus, tmp_path, capsys):
    from genprobe.corpus.tokenizer import CharTokenizer
    from genprobe.model.checkpoint import load_checkpoint, save_checkpoint
    from genprobe.model.gpt import GPT

    tok = CharTokenizer.from_text(corpus.text, tiny_cfg.vocab_size - 2)
    torch.manual_seed(0)
    model = GPT(tiny_cfg).eval()
    save_checkpoint(tmp_path / "orig", model, tok, {"note": "tiny"})
    torch.manual_seed(3)
    dirs = {0: torch.randn(32), 1: torch.randn(32)}
    units = {0: torch.rand(64), 1: torch.rand(64)}
    patch = finalise(model, make_patch(model, EditSpec((0, 1), 5, "project", 1.0), dirs, units))
    save_patch(patch, tmp_path / "p")
    assert (
        main(
            [
                "loops",
                "apply",
                str(tmp_path / "orig"),
                str(tmp_path / "p.json"),
                "--out",
                str(tmp_path / "new"),
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["state_sha256"] == patch.meta["sha256_after"]
    m2, _, meta = load_checkpoint(tmp_path / "new")
    assert state_sha256(m2) == patch.meta["sha256_after"] and meta["summary"]["loop_patch"]["edit"]["form"] == "project"
    # applying twice is refused (exit 2, message names both hashes)
    assert main(["loops", "apply", str(tmp_path / "new"), str(tmp_path / "p.json"), "--in-place"]) == 2
    err = capsys.readouterr().err
    assert patch.meta["sha256_before"] in err and patch.meta["sha256_after"] in err
    assert (
        main(["loops", "revert", str(tmp_path / "new"), str(tmp_path / "p.json"), "--out", str(tmp_path / "back")]) == 0
    )
    m3, _, _ = load_checkpoint(tmp_path / "back")
    assert state_sha256(m3) == state_sha256(model) == patch.meta["sha256_before"]
    assert sha256_file(tmp_path / "back" / "model.safetensors") == sha256_file(tmp_path / "orig" / "model.safetensors")
    # reverting the original (unpatched) checkpoint is refused
    assert main(["loops", "revert", str(tmp_path / "orig"), str(tmp_path / "p.json"), "--in-place"]) == 2


def test_cli_scan_char_model_defaults(trained_ckpt, capsys, tmp_path):
    assert (
        main(
            [
                "loops",
                "scan",
                str(trained_ckpt),
                "--n",
                "12",
                "--max-new-tokens",
                "24",
                "--json",
                "--out",
                str(tmp_path / "scan"),
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert set(out["scans"]) == {"chanting", "greedy"} and out["prompt_source"] == "tang-heldout-openings"
    assert out["end_token"]["banned"] is False  # the char vocabulary has no end token
    for s in out["scans"].values():
        r = s["summary"]
        assert r["n"] == 12 and 0.0 <= r["degenerate_rate"] <= 1.0
        assert r["degenerate_rate"] >= max(r["any_loop_rate"], r["repetitive_rate"])
        assert r["any_loop_rate"] >= max(r["loop_rate"], r["near_loop_rate"])
    full = json.loads((tmp_path / "scan" / "scan.json").read_text(encoding="utf-8"))
    recs = full["scans"]["chanting"]["records"]
    assert len(recs) == 12 and all(1 not in r["tokens"] for r in recs)  # <unk> banned in the chanting setting
    assert main(["loops", "scan", str(trained_ckpt), "--max-new-tokens", "5"]) == 2
    assert "--max-new-tokens must be >= 16" in capsys.readouterr().err


def test_cli_locate_char_model(trained_ckpt, capsys):
    assert main(["loops", "locate", str(trained_ckpt), "--n", "64", "--max-new-tokens", "32", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["inputs"]["prompt_source"] == "tang-heldout-openings" and out["inputs"]["direction"]["n"] == 64
    assert {a["layer"] for a in out["locate"]["per_layer"]} == {0, 1}
    assert len(out["directions"]["0"]["vector"]) == 128  # d_model of the quick recipe
    assert out["baseline"]["direction"]["degenerate_rate"] >= out["baseline"]["direction"]["loop_rate"]


def test_cli_scan_prompts_given_on_the_command_line_or_tang_explicitly(hf_dir, capsys):
    assert (
        main(
            [
                "loops",
                "scan",
                str(hf_dir),
                "--prompt",
                "床前明月",
                "舉頭望",
                "--max-new-tokens",
                "16",
                "--setting",
                "greedy",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["prompts"] == 2 and out["prompt_source"] == "command line"
    assert (
        main(
            [
                "loops",
                "scan",
                str(hf_dir),
                "--tang-prompts",
                "--n",
                "3",
                "--max-new-tokens",
                "16",
                "--setting",
                "greedy",
                "--json",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["prompt_source"] == "tang-heldout-openings"


def test_cli_scan_sample_setting_uses_the_shared_sampler_flags(hf_dir, capsys):
    assert (
        main(
            [
                "loops",
                "scan",
                str(hf_dir),
                "--prompt",
                "床前明月",
                "--setting",
                "sample",
                "--temperature",
                "0.8",
                "--top-p",
                "0.9",
                "--max-new-tokens",
                "16",
                "--json",
            ]
        )
        == 0
    )
    s = json.loads(capsys.readouterr().out)["scans"]["sample"]["settings"]
    assert s["sampler"]["temperature"] == 0.8 and s["sampler"]["top_p"] == 0.9 and s["eos_banned"]
    assert main(["loops", "scan", str(hf_dir), "--prompt", "床前明月", "--setting", "sample", "--top-p", "1.5"]) == 2
    assert "top_p" in capsys.readouterr().err  # validated by the shared sampler config


def test_cli_scan_sampler_flags_are_never_ignored(hf_dir, capsys):
    """Sampler flags without --setting scan with them; beside a greedy setting they are an error, not ignored."""
    assert (
        main(
            [
                "loops",
                "scan",
                str(hf_dir),
                "--prompt",
                "床前明月",
                "--temperature",
                "0.8",
                "--top-p",
                "0.9",
                "--max-new-tokens",
                "16",
                "--json",
            ]
        )
        == 0
    )
    scans = json.loads(capsys.readouterr().out)["scans"]
    assert list(scans) == ["sample"] and scans["sample"]["settings"]["sampler"]["top_p"] == 0.9
    assert main(["loops", "scan", str(hf_dir), "--prompt", "床前明月", "--setting", "chanting", "--top-p", "0.9"]) == 2
    assert "--top-p set the sampler of --setting sample" in capsys.readouterr().err


def test_cli_locate_judges_prompts_with_calibrated_detectors(trained_ckpt, tmp_path, capsys):
    """locate (and repair) calibrate "degenerate" on human text as scan does: which prompts count as loop-prone
    decides the direction. Human text that itself repeats raises the thresholds, so fewer generations are
    flagged than with the raw defaults; --no-calibrate keeps the raw ones and records no calibration."""
    human = tmp_path / "human.txt"  # "human" text that is one long loop: every threshold goes to its cap
    human.write_text("\n".join(["白雲" * 24 + "山水" * 8] * 30), encoding="utf-8")
    base = ["loops", "locate", str(trained_ckpt), "--n", "48", "--max-new-tokens", "32", "--json"]
    assert main([*base, "--human-text", str(human)]) == 0
    cal = json.loads(capsys.readouterr().out)
    assert main([*base, "--no-calibrate"]) == 0
    raw = json.loads(capsys.readouterr().out)
    assert raw["calibration"] is None
    c = cal["calibration"]
    assert c["source"] == f"file:{human}" and c["changed"], c  # the repeating human text moved the thresholds
    assert cal["baseline"]["direction"]["degenerate_rate"] < raw["baseline"]["direction"]["degenerate_rate"], (
        cal["baseline"],
        raw["baseline"],
    )
