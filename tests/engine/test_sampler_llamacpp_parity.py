"""The ``llama.cpp`` engine against llama.cpp's samplers (C++; not importable here).

Part 1 replays the vectors of llama.cpp's own unit tests (tests/test-sampling.cpp: test_top_k,
test_top_p, test_min_p, test_xtc, test_typical, test_penalties, test_dry, test_top_n_sigma), which
give the probabilities left after one sampler for logits = logf(probs). Part 2 holds vectors
produced by compiling llama.cpp's src/llama-sampler.cpp (ggml-org/llama.cpp, commit d1b67c94,
2026-05-30) and calling its public samplers (llama_sampler_init_top_k / _top_p / _min_p / _typical /
_top_n_sigma / _xtc / _penalties and llama_sampler_init_dry_testing) on logits with ties, -inf
entries and exactly-hit thresholds, recorded once as data in ``data/llamacpp_vectors.json`` (each case:
logits, history, breakers, the stage list, and the candidates llama.cpp left in its array, in order).
No llama.cpp code or build recipe is kept in this repository: the vectors are its observed behaviour.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from genprobe.engine.samplers.chain import process_logits
from genprobe.engine.samplers.stages import SamplerConfig

LLAMA = SamplerConfig(order="llama.cpp")
DATA = Path(__file__).parent / "data"


def _logits(probs: list[float]) -> torch.Tensor:
    return torch.from_numpy(np.log(np.array(probs, dtype=np.float32)))[None, :]


def _check(probs_after: torch.Tensor, expected: list[float]) -> None:
    """Kept probabilities (renormalised, sorted) equal llama.cpp's to 1e-5, the tolerance of its tests."""
    exp = np.array([e for e in expected if e > 0], dtype=np.float64)
    exp = np.sort(exp / exp.sum())[::-1]
    got = probs_after[0][probs_after[0] > 0].double().sort(descending=True).values.numpy()
    assert len(got) == len(exp) and np.allclose(got, exp, atol=1e-5), (got, exp)


P4 = [0.1, 0.2, 0.3, 0.4]


@pytest.mark.parametrize(
    "k, expected", [(1, [1.0]), (3, [0.44444, 0.33333, 0.22222]), (4, [0.4, 0.3, 0.2, 0.1]), (0, [0.1, 0.2, 0.3, 0.4])]
)
def test_top_k_vectors(k, expected):
    """test-sampling.cpp test_top_k (llama_sampler_top_k_impl)."""
    _check(process_logits(_logits(P4), None, LLAMA.replace(top_k=k)).softmax(-1), expected)


@pytest.mark.parametrize(
    "p, expected", [(0.7, [0.571429, 0.428571]), (0.8, [0.44444, 0.33333, 0.22222]), (1.0, [0.1, 0.2, 0.3, 0.4])]
)
def test_top_p_vectors(p, expected):
    """test-sampling.cpp test_top_p (llama_sampler_top_p_apply); p = 0 is refused by our validation."""
    _check(process_logits(_logits(P4), None, LLAMA.replace(top_p=p)).softmax(-1), expected)


@pytest.mark.parametrize(
    "p, expected",
    [
        (0.0, P4),
        (0.24, P4),
        (0.26, [0.2, 0.3, 0.4]),
        (0.49, [0.2, 0.3, 0.4]),
        (0.51, [0.3, 0.4]),
        (0.74, [0.3, 0.4]),
        (0.76, [0.4]),
        (1.0, [0.4]),
    ],
)
def test_min_p_vectors(p, expected):
    """test-sampling.cpp test_min_p (llama_sampler_min_p_apply); min_p > 1 is refused by our validation."""
    _check(process_logits(_logits(P4), None, LLAMA.replace(min_p=p)).softmax(-1), expected)


@pytest.mark.parametrize(
    "t, expected", [(0.09, [0.1]), (0.19, [0.2, 0.1]), (0.29, [0.3, 0.2, 0.1]), (0.39, [0.4, 0.3, 0.2, 0.1])]
)
def test_xtc_vectors(t, expected):
    """test-sampling.cpp test_xtc (llama_sample_xtc_apply), XTC certain to fire (their seed-0 draw fires at 0.99)."""
    cfg = LLAMA.replace(xtc_probability=1.0, xtc_threshold=t)
    gen = torch.Generator().manual_seed(0)
    probs = process_logits(_logits([0.4, 0.3, 0.2, 0.1]), None, cfg, generator=gen).softmax(-1)
    _check(probs, expected)


@pytest.mark.parametrize(
    "probs, expected", [([0.97, 0.01, 0.01, 0.01], [0.97]), ([0.4, 0.2, 0.2, 0.2], [0.2, 0.2, 0.2])]
)
def test_typical_vectors(probs, expected):
    """test-sampling.cpp test_typical (llama_sampler_typical_apply)."""
    _check(process_logits(_logits(probs), None, LLAMA.replace(typical_p=0.5)).softmax(-1), expected)


@pytest.mark.parametrize(
    "last, expected, rep, freq, pres",
    [
        ([0], [0, 0.25, 0.25, 0.25, 0.25], 50.0, 0.0, 0.0),
        ([0, 1, 2], [0, 0, 0, 0.5, 0.5], 50.0, 0.0, 0.0),
        ([0, 1, 2, 0, 0], [0, 0, 0, 0.5, 0.5], 50.0, 0.0, 0.0),
        ([0], [0.000011, 0.249997, 0.249997, 0.249997, 0.249997], 1.0, 5.0, 5.0),
        ([0, 1, 2], [0.000023, 0.000023, 0.000023, 0.499966, 0.499966], 1.0, 5.0, 5.0),
        ([0, 1, 2, 0, 0], [0.000000, 0.000023, 0.000023, 0.499977, 0.499977], 1.0, 5.0, 5.0),
    ],
)
def test_penalty_vectors(last, expected, rep, freq, pres):
    """test-sampling.cpp test_penalties (llama_sampler_penalties_apply), window = len(last_tokens)."""
    cfg = LLAMA.replace(repetition_penalty=rep, frequency_penalty=freq, presence_penalty=pres, penalty_last_n=len(last))
    got = process_logits(_logits([0.2] * 5), torch.tensor([last]), cfg).softmax(-1)[0].double().numpy()
    assert np.allclose(got, expected, atol=1e-5), got


@pytest.mark.parametrize(
    "probs, last, expected, mult, base, allowed, last_n, breakers",
    [
        ([0.25] * 4, [0, 1], [0.25] * 4, 1.0, 1.1, 2, 4, []),
        ([0.25] * 4, [0, 1, 2, 0, 1], [0.296923, 0.296923, 0.109232, 0.296923], 1.0, 1.1, 2, 5, []),
        ([0.2] * 5, [0, 1, 3, 4, 0, 1], [0.2] * 5, 1.0, 1.1, 2, 6, [[3]]),
        ([0.2] * 5, [0, 1, 2, 0, 1], [0.241818, 0.241818, 0.032727, 0.241818, 0.241818], 2.0, 1.1, 2, 5, []),
        ([0.2] * 5, [0, 1, 2, 3, 4, 0, 1], [0.2] * 5, 1.0, 1.1, 4, 7, []),
    ],
)
def test_dry_vectors(probs, last, expected, mult, base, allowed, last_n, breakers):
    """test-sampling.cpp test_dry (llama_sampler_dry_apply via llama_sampler_init_dry_testing)."""
    cfg = LLAMA.replace(
        dry_multiplier=mult,
        dry_base=base,
        dry_allowed_length=allowed,
        dry_last_n=last_n,
        dry_sequence_breakers=tuple(tuple(b) for b in breakers),
    )
    got = process_logits(_logits(probs), torch.tensor([last]), cfg).softmax(-1)[0].double().numpy()
    assert np.allclose(got, expected, atol=1e-5), got


@pytest.mark.parametrize("n, expected", [(1.0, [0.571429, 0.428571]), (0.0, P4), (3.0, P4)])
def test_top_n_sigma_vectors(n, expected):
    """test-sampling.cpp test_top_n_sigma (llama_sampler_top_n_sigma_apply); 0 is a no-op."""
    _check(process_logits(_logits(P4), None, LLAMA.replace(top_n_sigma=n)).softmax(-1), expected)


# ---- part 2: vectors from llama.cpp's compiled samplers --------------------------------------
VECTORS = json.loads((DATA / "llamacpp_vectors.json").read_text(encoding="utf-8"))["cases"]
_FIELDS = {
    "top_k": ("top_k",),
    "top_p": ("top_p",),
    "min_p": ("min_p",),
    "typical": ("typical_p",),
    "top_n_sigma": ("top_n_sigma",),
    "xtc": ("xtc_probability", "xtc_threshold"),
    "temp": ("temperature",),
    "penalties": ("penalty_last_n", "repetition_penalty", "frequency_penalty", "presence_penalty"),
    "dry": ("dry_multiplier", "dry_base", "dry_allowed_length", "dry_last_n"),
}


def _config(c: dict) -> SamplerConfig:
    kw: dict = {"dry_sequence_breakers": tuple(tuple(b) for b in c["breakers"])}
    for stage, *values in c["stages"]:
        kw.update(zip(_FIELDS[stage], values, strict=True))
    return LLAMA.replace(**kw)


def _float(x) -> float:
    """A JSON number (printed with 9 significant digits) back to its exact float32 value."""
    return float(np.float32(x if not isinstance(x, str) else float(x.replace("inf", "Infinity"))))


@pytest.mark.parametrize("c", VECTORS, ids=lambda c: c["name"])
def test_llama_cpp_compiled_vectors(c):
    """Same survivors and final logits as llama.cpp's samplers; where its sort leaves a tie's winner
    unspecified (std::partial_sort), the same number of survivors with the same logit values."""
    z = torch.tensor([[_float(x) for x in c["logits"]]], dtype=torch.float32)
    hist = torch.tensor([c["history"]]) if c["history"] else None
    with np.errstate(over="ignore"):
        out = process_logits(z, hist, _config(c), generator=torch.Generator().manual_seed(0))[0]
    ours = {i: float(out[i]) for i in torch.isfinite(out).nonzero().flatten().tolist()}
    pairs = zip(c["expected_ids"], c["expected_logits"], strict=True)
    theirs = {i: _float(v) for i, v in pairs if not math.isinf(_float(v))}
    if ours.keys() == theirs.keys():
        assert all(ours[i] == theirs[i] for i in ours), (ours, theirs)
        return
    assert sorted(ours.values()) == sorted(theirs.values()), (ours, theirs)
    inputs = c["logits"]
    for i in set(ours) ^ set(theirs):
        assert sum(1 for x in inputs if x == inputs[i]) >= 2, f"id {i} differs without a tie: {ours} vs {theirs}"
