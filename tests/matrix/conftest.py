"""Tiny random configurations of the architectures genprobe supports, saved as transformers directories.

Weights are drawn with a large ``initializer_range`` so that logits spread over several nats and greedy
continuations vary: with the default 0.02 every random model repeats one token and token equality
would prove nothing.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

VOCAB = 96
ARCHS = ("gpt2", "llama", "qwen2", "mistral", "gemma2", "gemma3", "phi3", "gpt_neox")
SLIDING_WINDOW = 8  # shorter than the test sequences: the window really evicts


def tiny_config(arch: str):
    """A 2-layer config of ``arch`` with grouped-query attention where the architecture has it."""
    import transformers as T

    # Gemma scales embeddings by sqrt(hidden) and ties them to the output: a large init makes it echo its input.
    init = 0.05 if arch.startswith("gemma") else 0.3
    ids = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, initializer_range=init)
    common = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        **ids,
    )
    builders = {
        "gpt2": lambda: T.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, **ids),
        "llama": lambda: T.LlamaConfig(**common),
        "qwen2": lambda: T.Qwen2Config(**common),
        "mistral": lambda: T.MistralConfig(**common, sliding_window=SLIDING_WINDOW),
        "gemma2": lambda: T.Gemma2Config(**common, head_dim=8, sliding_window=SLIDING_WINDOW),
        "gemma3": lambda: T.Gemma3TextConfig(**common, head_dim=8, sliding_window=SLIDING_WINDOW),
        "phi3": lambda: T.Phi3Config(**common),
        "gpt_neox": lambda: T.GPTNeoXConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=64,
            **ids,
        ),
    }
    return builders[arch]()


def build_tiny(arch: str, seed: int = 0):
    """A seeded random model of ``arch`` in eval mode (float32)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoModelForCausalLM.from_config(tiny_config(arch)).eval()


@pytest.fixture(scope="session")
def tiny_hf_dirs(tmp_path_factory) -> dict[str, Path]:
    """arch → a saved transformers directory (config.json + model.safetensors), built once per session."""
    root = tmp_path_factory.mktemp("archs")
    out = {}
    for arch in ARCHS:
        build_tiny(arch).save_pretrained(root / arch)
        out[arch] = root / arch
    return out


# --- the architecture table of docs/arch-matrix.md, written from the outcomes of this directory's tests ------------

COLUMNS = {  # test function → column title
    "test_generate": "generate = transformers greedy",
    "test_verify_cache": "verify-cache",
    "test_attention_capture": "attention capture",
    "test_mlp_sites_and_patch": "MLP sites + patch/revert",
}
_OUTCOMES: dict[tuple[str, str], str] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Remember each matrix cell's outcome (the call phase decides; a setup error counts as a failure)."""
    report = (yield).get_result()
    name = getattr(item, "originalname", item.name)
    arch = getattr(item, "callspec", None) and item.callspec.params.get("arch")
    if name in COLUMNS and arch and (report.when == "call" or report.failed):
        _OUTCOMES[(arch, name)] = "pass" if report.passed else "FAIL"


def matrix_markdown(outcomes: dict[tuple[str, str], str]) -> str:
    """architecture × capability → pass/FAIL as a markdown table (cells not run are '—')."""
    lines = ["| architecture | " + " | ".join(COLUMNS.values()) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for arch in ARCHS:
        lines.append(f"| {arch} | " + " | ".join(outcomes.get((arch, c), "—") for c in COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def pytest_sessionfinish(session, exitstatus):
    """With GENPROBE_MATRIX_OUT=FILE, write the table (atomically) after the run."""
    import os

    out = os.environ.get("GENPROBE_MATRIX_OUT")
    if out and _OUTCOMES:
        from genprobe._io import atomic_write_text

        atomic_write_text(out, matrix_markdown(_OUTCOMES))
