"""Fixtures of the verifier tests: tiny models whose logits have a trained model's scale.

A freshly initialised GPT (std 0.02) has logits of magnitude ~0.1, so even a grossly wrong cache
moves them by < 1 and the seed's absolute scale (> 1 = bug) could not fire. Scaling every weight
matrix by 10 gives logits of the trained model's order (~10) without training.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from genprobe.model.config import GPTConfig
from genprobe.model.gpt import GPT

PROMPT = [3, 7, 11, 5, 9, 2, 8]  # 7 tokens: longer than every chunk size the tests use


def sharpen(model: torch.nn.Module, scale: float = 10.0) -> torch.nn.Module:
    """Multiply every weight matrix by ``scale`` (in place)."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(scale)
    return model


def make_sharp_model() -> GPT:
    """A seeded tiny GPT (learned positions) with trained-scale logits."""
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=50, n_layer=2, n_head=2, d_model=32, d_ff=64, block_size=32)
    return sharpen(GPT(cfg)).eval()


@pytest.fixture
def sharp_model() -> GPT:
    """A fresh :func:`make_sharp_model` per test."""
    return make_sharp_model()


@pytest.fixture(scope="module")
def shared_sharp_model() -> GPT:
    """One :func:`make_sharp_model` per test module, for read-only use by module-scoped fixtures."""
    return make_sharp_model()


@pytest.fixture
def prompt() -> list[int]:
    """The default 7-token prompt."""
    return list(PROMPT)


# distinct characters: the two default prompts first (the seed's and a second), then consecutive CJK code points
CHARS = "".join(dict.fromkeys("春江潮水连海平白日依山盡" + "".join(chr(0x4E00 + i) for i in range(60))))
HERE = Path(__file__).resolve().parent


def save_tiny_ckpt(directory: Path, model: GPT) -> Path:
    """``model`` saved as a genprobe checkpoint with a character vocabulary of its size."""
    from genprobe.corpus.tokenizer import CharTokenizer
    from genprobe.model.checkpoint import save_checkpoint

    tok = CharTokenizer(list(CHARS[: model.cfg.vocab_size - 2]))
    return save_checkpoint(directory, model, tok, {})


@pytest.fixture
def tiny_ckpt(tmp_path, sharp_model) -> Path:
    """The sharp tiny model as a genprobe checkpoint directory."""
    return save_tiny_ckpt(tmp_path / "ckpt", sharp_model)


@pytest.fixture
def user_impls(monkeypatch):
    """The module name of tests/verify/user_impls.py, importable for ``--impl user_impls:factory``."""
    monkeypatch.syspath_prepend(str(HERE))
    return "user_impls"


@pytest.fixture
def U(user_impls):
    """The imported user_impls module (a user's implementations, written outside genprobe)."""
    import importlib

    return importlib.import_module(user_impls)


@pytest.fixture(scope="module")
def long_model() -> GPT:
    """A sharp tiny GPT with a 64-position context: room for the prefix-reuse sequences (48 tokens, 3 blocks of 16)."""
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=50, n_layer=2, n_head=2, d_model=32, d_ff=64, block_size=64)
    return sharpen(GPT(cfg)).eval()
