"""Fixtures of the report tests: a small synthetic case with the real structure."""

from __future__ import annotations

import pytest
import torch

from genprobe._io import json_safe
from genprobe.corpus.tokenizer import CharTokenizer
from genprobe.experiments.exposure import run_exposure
from genprobe.experiments.sampling import run_sampling
from genprobe.experiments.timing import run_cache_scaling, run_cache_timing
from genprobe.model.config import GPTConfig
from genprobe.model.gpt import GPT
from genprobe.report.headline import seed_tables


@pytest.fixture(scope="session")
def small_case(corpus):
    """A case dict from a tiny random model: real structure, fake numbers where they cost time."""
    tok = CharTokenizer.from_text(corpus.text, 60)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, n_layer=1, n_head=2, d_model=32, d_ff=64, block_size=64)).eval()
    seed = seed_tables()
    case = {
        "meta": {
            "genprobe": "test",
            "torch": torch.__version__,
            "threads": 1,
            "device": "cpu",
            "quick": True,
            "created_utc": "2026-01-01T00:00:00Z",
            "seconds": {"sampling": 0.1},
        },
        "model": {
            "params": model.num_parameters(),
            "val_loss": 4.0,
            "unigram_ce": 5.0,
            "coverage_1200": 0.5,
            "unk_share": 0.5,
        },
        "decoding": _fake_decoding(),
        "sampling": json_safe(run_sampling(model, tok)),
        "exposure": json_safe(run_exposure(model, tok, corpus, quick=True)),
        "cache_exact": {
            "prefill_max_abs_dlogit": 0.0,
            "incremental_max_abs_dlogit": 1e-6,
            "chunk4_max_abs_dlogit": 1e-6,
            "verdict": "pass",
        },
        "cache_bugs": [
            dict(r, verdict="pass" if r["impl"] in ("correct", "cat_order") else "bug", as_expected=True)
            for r in seed["cache_bugs"]
        ],
        "mask_noop": dict(seed["mask_noop"]),
        "cache_timing": json_safe(run_cache_timing(model, [3, 4, 5], new_tokens=4, batches=(1, 2), reps=1)),
        "cache_scaling": json_safe(
            run_cache_scaling(
                [3, 4, 5],
                tok.vocab_size,
                new_tokens=(2, 4),
                reps=1,
                cfg=GPTConfig(vocab_size=tok.vocab_size, n_layer=1, n_head=2, d_model=32, d_ff=64, block_size=16),
            )
        ),
    }
    return case


def _fake_decoding() -> dict:
    seed = seed_tables()["decoding"]
    rows = []
    for i, r in enumerate(seed["rows"]):
        rows.append(
            {
                **r,
                "sampler": {"greedy": i < 2},
                "text": "春江",
                "text_with_unk": "春江<unk></script>",
                "longest_repeat_text": "。，",
                "looping": i == 0,
                "loop_period": 2 if i == 0 else None,
                "loop_onset": 0 if i == 0 else None,
                "loop_unit": "。，" if i == 0 else None,
            }
        )
    return {
        "prompt": "春江潮水连海平",
        "prompt_unknown_chars": ["连"],
        "new_tokens": 50,
        "rows": rows,
        "sampling_bans_unk": True,
        "rows_sampling_with_unk": [],
        "other_prompts": [],
    }
