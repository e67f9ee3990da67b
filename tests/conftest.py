"""Shared fixtures: a tiny random model, and one quickly trained Tang checkpoint per test session.

The trained checkpoint (600 steps, ≈70 s on 2 cores) is cached under ``$GENPROBE_TEST_CACHE``
(default: ``<repo>/.test-cache``) keyed by the recipe, so the suite trains it at most once.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch

from genprobe.corpus import CharTokenizer, load_corpus
from genprobe.model import GPT, GPTConfig

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def corpus():
    """The default corpus (first 4,003 poems)."""
    return load_corpus()


@pytest.fixture(scope="session")
def tokenizer(corpus):
    """The default 1,200-character tokenizer."""
    return CharTokenizer.from_text(corpus.text, 1200)


@pytest.fixture
def tiny_cfg() -> GPTConfig:
    """A small random config for fast structural tests."""
    return GPTConfig(vocab_size=50, n_layer=2, n_head=2, d_model=32, d_ff=64, block_size=32)


@pytest.fixture
def tiny_model(tiny_cfg) -> GPT:
    """A seeded random tiny GPT in eval mode."""
    torch.manual_seed(0)
    return GPT(tiny_cfg).eval()


@pytest.fixture(scope="session")
def trained_ckpt(corpus, tokenizer) -> Path:
    """Path of a Tang checkpoint trained with the quick recipe (shared by all tests)."""
    from dataclasses import asdict

    from genprobe.model.checkpoint import is_checkpoint, save_checkpoint
    from genprobe.model.train import quick_train_config, train

    tc = quick_train_config()
    key = hashlib.sha256(json.dumps(asdict(tc), sort_keys=True).encode() + torch.__version__.encode()).hexdigest()[:12]
    root = Path(os.environ.get("GENPROBE_TEST_CACHE", REPO / ".test-cache"))
    d = root / f"tang-quick-{key}"
    if not is_checkpoint(d):
        r = train(corpus, tokenizer, tc=tc, progress=False)
        save_checkpoint(d, r.model, tokenizer, r.summary)
    return d


@pytest.fixture(scope="session")
def trained(trained_ckpt):
    """(model, tokenizer, meta) of the shared trained checkpoint."""
    from genprobe.model.checkpoint import load_checkpoint

    return load_checkpoint(trained_ckpt)
