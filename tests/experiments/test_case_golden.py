"""``ch3_case.json`` cannot change silently: its full key layout and its deterministic values are pinned.

A tiny seeded random GPT (no training) runs every experiment of ``run_experiments``; the result is compared
with ``data/ch3_case_tiny.json``: every key at every depth, every string and int exactly, floats to
2e-4 (they are stored rounded to 4 decimals), wall-clock and environment fields by type only.
An intended change of the case output regenerates the file::

    PYTHONPATH=src python tests/experiments/test_case_golden.py --regenerate
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

from genprobe._io import json_safe

pytestmark = pytest.mark.slow  # about 25 s of CPU: every experiment of the case study

GOLDEN = Path(__file__).parent / "data" / "ch3_case_tiny.json"
#: Fields whose values are wall-clock or describe the machine: compared by type, never by value.
VOLATILE = {
    "created_utc",
    "seconds",
    "load_average",
    "threads",
    "cpu_count",
    "genprobe",
    "torch",
    "python",
    "machine",
    "naive_s",
    "cached_s",
    "speedup",
    "predicted_naive_s",
    "runs",
    "skipped",
}


def tiny_case() -> dict:
    """``run_experiments`` on a seeded random 1-layer GPT over the default 1,200-character tokenizer.

    The cache-scaling experiment's 8-layer random model is swapped for a 1-layer one: its layout is
    what is pinned here, and the big model would cost more than every other experiment together.
    """
    from genprobe.corpus.tang import load_corpus
    from genprobe.corpus.tokenizer import CharTokenizer
    from genprobe.experiments import timing
    from genprobe.experiments.case import run_experiments
    from genprobe.model.config import GPTConfig
    from genprobe.model.gpt import GPT

    corpus = load_corpus()
    tok = CharTokenizer.from_text(corpus.text, 1200)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, n_layer=1, n_head=2, d_model=32, d_ff=64, block_size=64)).eval()
    meta = {
        "summary": {
            "train_loss": 5.0,
            "val_loss": 5.1,
            "unigram_ce": 5.6,
            "coverage": 0.87,
            "unk_share": 0.12,
            "corpus": {"documents": 4003, "chars": 123},
            "train_config": {"steps": 0},
            "seconds": 0.0,
        }
    }

    def tiny_scaling(vocab_size, max_new, prompt_len, small=False):
        return GPTConfig(
            vocab_size=vocab_size, n_layer=1, n_head=2, d_model=32, d_ff=64, block_size=prompt_len + max_new + 1
        )

    with mock.patch.object(timing, "scaling_config", tiny_scaling):
        return json_safe(run_experiments(model, tok, corpus, meta, quick=True, progress=False))


#: Below this, a logit difference is float32 rounding, whose size (and so which phase shows the most of it) depends
#: on the CPU's kernels: the phase named the worst is then compared by type only.
ROUNDING_DLOGIT = 1e-5


def differences(want, got, path: str = "") -> list[str]:
    """Human-readable differences between the golden case and a new one."""
    key = path.rsplit(".", 1)[-1].split("[")[0]
    if isinstance(want, dict) and isinstance(got, dict) and "worst_phase" in want and "worst_phase" in got:
        if max(want.get("max_abs_dlogit") or 0.0, got.get("max_abs_dlogit") or 0.0) < ROUNDING_DLOGIT:
            want, got = dict(want), dict(got)
            if isinstance(want["worst_phase"], str) and isinstance(got["worst_phase"], str):
                want["worst_phase"] = got["worst_phase"]
    if key in VOLATILE:
        same_kind = (
            (want is None) == (got is None)
            and isinstance(got, type(want))
            or (isinstance(want, (int, float)) and isinstance(got, (int, float)))
        )
        return [] if same_kind else [f"{path}: type {type(want).__name__} -> {type(got).__name__}"]
    if isinstance(want, dict) and isinstance(got, dict):
        if list(want) != list(got):
            return [f"{path}: keys {list(want)} -> {list(got)}"]
        return [d for k in want for d in differences(want[k], got[k], f"{path}.{k}")]
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return [f"{path}: {len(want)} items -> {len(got)}"]
        return [d for i, (a, b) in enumerate(zip(want, got, strict=True)) for d in differences(a, b, f"{path}[{i}]")]
    if isinstance(want, float) and isinstance(got, float) and not isinstance(want, bool):
        return [] if math.isclose(want, got, abs_tol=2e-4) else [f"{path}: {want} -> {got}"]
    if type(want) is not type(got) or want != got:
        return [f"{path}: {want!r} -> {got!r}"]
    return []


@pytest.fixture(scope="module")
def case() -> dict:
    return json.loads(json.dumps(tiny_case(), allow_nan=False))  # exactly what the JSON file would hold


def test_case_matches_the_golden_file(case):
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    diff = differences(golden, case)
    assert not diff, "ch3_case.json changed (regenerate the golden file if intended):\n" + "\n".join(diff[:40])


def test_every_experiment_and_key_is_present(case):
    from genprobe.experiments.case import CASE_KEYS

    assert list(case) == ["meta", *CASE_KEYS]
    assert set(case["decoding"]) >= {"rows", "rows_sampling_with_unk", "other_prompts", "teacher_forcing"}


def test_the_comparison_catches_changes(case):
    """The golden comparison is not vacuous: a renamed key, a moved value, a dropped row are all reported."""
    renamed = json.loads(json.dumps(case))
    renamed["sampling"]["log_V"] = renamed["sampling"].pop("log_vocab")
    moved = json.loads(json.dumps(case))
    moved["exposure"]["teacher_forcing_mean_loss"] += 0.01
    dropped = json.loads(json.dumps(case))
    dropped["decoding"]["rows"].pop()
    timing = json.loads(json.dumps(case))
    timing["cache_timing"]["rows"][0]["naive_s"] *= 3  # wall clock: allowed to move
    rounding = json.loads(json.dumps(case))  # which phase shows the most float32 rounding: CPU-dependent
    bug = json.loads(json.dumps(case))  # which phase shows a real difference: pinned
    for variant, big in ((rounding, False), (bug, True)):
        row = next(r for r in variant["cache_bugs"] if (r["max_abs_dlogit"] >= ROUNDING_DLOGIT) == big)
        row["worst_phase"] = "prefill" if row["worst_phase"] != "prefill" else "incremental"
    assert differences(case, case) == [] and differences(case, timing) == [] and differences(case, rounding) == []
    for changed in (renamed, moved, dropped, bug):
        assert differences(case, changed)


if __name__ == "__main__" and "--regenerate" in sys.argv:
    GOLDEN.write_text(json.dumps(tiny_case(), ensure_ascii=False, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    print(f"wrote {GOLDEN}")
