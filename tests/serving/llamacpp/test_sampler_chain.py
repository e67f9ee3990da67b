"""genprobe's llama.cpp preset against llama.cpp's *real* sampler chain (llama-cpp-python 0.3.36, its C API).

The same logits and history go through ``process_logits`` with ``engine="llama.cpp"`` (genprobe's float32
replay, :mod:`genprobe.engine.samplers.llama_cpp`) and through the chain :mod:`genprobe.serving.llamacpp.sampling`
builds from the config (``llama_sampler_chain_init`` + ``llama_sampler_init_*``, every history token accepted
first). The kept ids must be the same set and the probabilities equal to float32 rounding; the logits after
the chain must be bit-identical. Where a tie makes llama.cpp's kept set implementation-defined (top-k and XTC
cut through equal logits: ``std::partial_sort`` for k ≤ 128, a bucket pre-sort above; top-p and min-p on a
sorted array inherit that order), what is defined is tested: as many ids, the same logit values, and every id
that differs tied at the cut. Hard cases: ties, ``-inf`` entries, equal maxima, thresholds hit exactly in float32.

DRY needs a vocabulary (``llama_sampler_init_dry``): those tests read SmolLM2's GGUF from genprobe's cache
(``genprobe fetch smollm2``) and skip with that command when it is absent. The whole file is skipped, with the
reason, without the llama.cpp extra (tests/serving/llamacpp/conftest.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from genprobe.engine.samplers.chain import process_logits, sample_next
from genprobe.engine.samplers.llama_cpp import expf, logf
from genprobe.engine.samplers.stages import ChainStage, SamplerConfig, UnsupportedSamplerError
from genprobe.serving.llamacpp.sampling import KeptCandidates, LlamaCppSampler, chain_candidates, chain_stages

F32 = np.float32
NEG = -np.inf
LLAMA = SamplerConfig(order="llama.cpp")  # engine llama.cpp, every stage off
# Ties at 3.0 (four of them), an exact duplicate maximum pair at 5.0 in the second row, -inf entries.
TIED = np.array([1.0, 3.0, 3.0, 0.5, 3.0, NEG, 2.0, 3.0, -1.0, NEG], dtype=F32)
EQUAL_MAX = np.array([5.0, 1.0, 5.0, 0.0, 2.5, 2.5, NEG, -3.0], dtype=F32)
SPREAD = np.log(np.array([0.4, 0.2, 0.15, 0.1, 0.08, 0.04, 0.02, 0.01], dtype=F32))


def ours(logits: np.ndarray, history, cfg: SamplerConfig) -> tuple[dict[int, float], dict[int, float]]:
    """genprobe's kept ids → (final logit, probability)."""
    hist = None if history is None or not len(history) else torch.tensor([list(history)])
    z = process_logits(torch.from_numpy(logits.copy())[None], hist, cfg, generator=torch.Generator().manual_seed(0))[0]
    p = torch.softmax(z.double(), -1)
    keep = torch.isfinite(z).nonzero().flatten().tolist()
    return {i: float(z[i]) for i in keep}, {i: float(p[i]) for i in keep}


def agree(logits: np.ndarray, history, cfg: SamplerConfig, **kw) -> KeptCandidates:
    """Assert genprobe's preset and llama.cpp's chain keep the same candidates with the same logits/probabilities."""
    theirs = chain_candidates(logits, history, cfg, **kw)
    our_logit, our_p = ours(logits, history, cfg)
    their_logit = dict(zip(theirs.ids.tolist(), theirs.logits.tolist(), strict=True))
    their_p = theirs.as_dict()
    if set(our_logit) != set(their_logit):
        _tie_only(logits, our_logit, their_logit)
        return theirs
    assert our_logit == their_logit, (cfg, our_logit, their_logit)  # bit-identical float32 arithmetic
    for i, p in our_p.items():
        assert their_p[i] == pytest.approx(p, rel=2e-6, abs=1e-7), (cfg, i, our_p, their_p)
    return theirs


def _tie_only(logits: np.ndarray, ours_: dict[int, float], theirs: dict[int, float]) -> None:
    """A different kept set is allowed only where a tie decides it: same size, same values, ids all tied."""
    assert sorted(ours_.values()) == sorted(theirs.values()), (ours_, theirs)
    for i in set(ours_) ^ set(theirs):
        assert int((logits == logits[i]).sum()) >= 2, f"id {i} differs without a tie: {ours_} vs {theirs}"


# ---- one stage at a time -----------------------------------------------------------------------------------
@pytest.mark.parametrize("row", [TIED, EQUAL_MAX, SPREAD], ids=["tied", "equal-max", "spread"])
@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 7, 8, 10, 50])
def test_top_k(row, k):
    """llama_sampler_top_k_impl keeps exactly min(k, size) (ties at the cut: std::partial_sort picks); k ≥ V too."""
    got = agree(row, None, LLAMA.replace(top_k=k))
    assert len(got.ids) == min(k, int(np.isfinite(row).sum())) or k > int(np.isfinite(row).sum())


def _cumsum_like_llama(row: np.ndarray) -> np.ndarray:
    """The running float32 sum top-p compares (softmax in float32, descending stable order)."""
    e = expf(row - row.max())
    p = (e / np.cumsum(e, dtype=F32)[-1]).astype(F32)
    return np.cumsum(np.sort(p)[::-1], dtype=F32)


@pytest.mark.parametrize("row", [TIED, EQUAL_MAX, SPREAD], ids=["tied", "equal-max", "spread"])
@pytest.mark.parametrize("at", [0, 1, 2, 3])
@pytest.mark.parametrize("nudge", [-1, 0, 1])
def test_top_p_exact_thresholds(row, at, nudge):
    """llama_sampler_top_p_apply stops at the first float32 running sum >= p: p hit exactly, and one ulp either side."""
    target = _cumsum_like_llama(row)[at]
    p = float(np.nextafter(target, F32(2 * nudge), dtype=F32)) if nudge else float(target)
    if not 0 < p < 1:
        pytest.skip("p outside (0, 1)")
    agree(row, None, LLAMA.replace(top_p=p))


@pytest.mark.parametrize("row", [TIED, EQUAL_MAX, SPREAD], ids=["tied", "equal-max", "spread"])
@pytest.mark.parametrize("p", [0.01, 0.05, 0.1, 0.25, 0.5, 0.9, 1.0])
def test_min_p(row, p):
    """llama_sampler_min_p_apply compares logits: logit >= max + logf(p) (unsorted array: kept in array order)."""
    agree(row, None, LLAMA.replace(min_p=p))


def test_min_p_exact_threshold():
    """A logit exactly at max + logf(p) is kept, one ulp below is not (both sides agree on logf)."""
    p = 0.25
    edge = F32(F32(2.0) + logf(F32(p)))
    for x in (edge, np.nextafter(edge, F32(-10)), np.nextafter(edge, F32(10))):
        row = np.array([2.0, x, 0.0, x, -5.0], dtype=F32)
        agree(row, None, LLAMA.replace(min_p=p))


@pytest.mark.parametrize("row", [TIED, EQUAL_MAX, SPREAD], ids=["tied", "equal-max", "spread"])
@pytest.mark.parametrize("p", [0.2, 0.5, 0.9, 0.99])
def test_typical(row, p):
    """llama_sampler_typical_apply (with -inf entries: 0·log 0 = NaN entropy, the NaN-order quirk)."""
    agree(row, None, LLAMA.replace(typical_p=p))


@pytest.mark.parametrize("n", [8, 16, 17, 40, 300])
def test_typical_nan_order_is_libstdcxx_sort(n):
    """-inf candidates make typical-p's entropy NaN: std::sort then permutes the all-"equal" keys its own way
    (above 16 elements); the replay must follow it (candidates.std_sort_equivalent)."""
    rng = np.random.default_rng(n)
    row = rng.normal(0, 2, n).astype(F32)
    row[::7] = NEG
    for p in (0.3, 0.6, 0.9):
        agree(row, None, LLAMA.replace(typical_p=p))


@pytest.mark.parametrize("row", [TIED, EQUAL_MAX, SPREAD], ids=["tied", "equal-max", "spread"])
@pytest.mark.parametrize("n", [0.25, 0.5, 1.0, 2.0, 5.0])
def test_top_n_sigma(row, n):
    """llama_sampler_top_n_sigma_apply: population σ over the finite logits, -inf below max − n·σ."""
    agree(row, None, LLAMA.replace(top_n_sigma=n))


@pytest.mark.parametrize("t", [0.1, 0.5, 0.8, 1.0, 1.7, 3.0])
def test_temperature(t):
    """llama_sampler_temp_impl divides in float32, last in the chain (top-p sees the untempered logits)."""
    agree(SPREAD, None, LLAMA.replace(temperature=t))
    agree(SPREAD, None, LLAMA.replace(temperature=t, top_p=0.8))


@pytest.mark.parametrize("threshold", [0.05, 0.1, 0.15, 0.2, 0.4, 0.5, 0.6])
@pytest.mark.parametrize("row", [SPREAD, EQUAL_MAX], ids=["spread", "equal-max"])
def test_xtc_certain(row, threshold):
    """llama_sample_xtc_apply with probability 1 (its draw in [0, 1) never exceeds it): the RNGs play no part."""
    agree(row, None, LLAMA.replace(xtc_probability=1.0, xtc_threshold=threshold))


def test_xtc_threshold_hit_exactly():
    """A probability exactly equal to the threshold counts as a top choice (p >= threshold) on both sides."""
    row = np.log(np.array([0.5, 0.25, 0.125, 0.125], dtype=F32))
    e = expf(row - row.max())
    p = (e / np.cumsum(e, dtype=F32)[-1]).astype(F32)
    agree(row, None, LLAMA.replace(xtc_probability=1.0, xtc_threshold=float(p[1])))
    agree(row, None, LLAMA.replace(xtc_probability=1.0, xtc_threshold=float(np.nextafter(p[1], F32(1)))))


def test_xtc_random_coin_is_llama_cpps_own():
    """With 0 < probability < 1 llama.cpp flips its own std::mt19937 coin (seeded per chain), genprobe a torch
    generator: the outcomes are the same two sets — fired or not — in different steps (documented)."""
    cfg = LLAMA.replace(xtc_probability=0.5, xtc_threshold=0.1)
    fired = set(ours(SPREAD, None, cfg.replace(xtc_probability=1.0))[0])
    idle = set(range(len(SPREAD)))
    seen = {frozenset(chain_candidates(SPREAD, None, cfg, seed=s).ids.tolist()) for s in range(40)}
    assert seen == {frozenset(fired), frozenset(idle)}


# ---- penalties ---------------------------------------------------------------------------------------------
HIST = [3, 1, 1, 4, 7, 3, 3, 2, 1, 0, 5, 5, 6, 1]  # 14 tokens; 2 and 0 only in its middle


@pytest.mark.parametrize("last_n", [None, -1, 1, 3, 5, 6, 13, 14, 40])
@pytest.mark.parametrize(
    "rep, freq, pres", [(1.3, 0.0, 0.0), (1.0, 0.4, 0.0), (1.0, 0.0, 0.7), (1.5, 0.25, 0.5), (0.8, -0.2, 0.3)]
)
def test_penalties_window(last_n, rep, freq, pres):
    """llama_sampler_penalties_apply over its ring buffer of the last last_n accepted tokens: x<=0 ? x·p : x/p,
    then − count·freq − present; tokens before the window (here 2 and 0 for small windows) are left alone."""
    row = np.array([1.5, -0.5, 0.0, 2.0, 3.0, -2.0, 0.25, 1.0], dtype=F32)
    cfg = LLAMA.replace(repetition_penalty=rep, frequency_penalty=freq, presence_penalty=pres, penalty_last_n=last_n)
    agree(row, HIST, cfg)


def test_whole_history_window_is_the_context_length():
    """genprobe's penalty_last_n=-1 (the whole history) reaches 70 tokens back; llama.cpp clamps -1 to 0 = off
    (llama_sampler_init_penalties: std::max(penalty_last_n, 0)), so the mapping sends the context length."""
    hist = [0] + [1] * 70
    row = np.ones(3, dtype=F32)
    got = agree(row, hist, LLAMA.replace(repetition_penalty=2.0, penalty_last_n=-1))
    assert got.as_dict()[0] < got.as_dict()[2]  # token 0, 70 back, was penalised
    stages = chain_stages(LLAMA.replace(repetition_penalty=2.0, penalty_last_n=-1), context_length=4096)
    assert stages[0] == ChainStage("penalties", (4096, 2.0, 0.0, 0.0))


# ---- DRY (a real vocabulary) -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2_vocab():
    """SmolLM2's vocabulary from the GGUF that `genprobe fetch smollm2` keeps (skipped with the command if absent)."""
    from install_wait import llama_cpp_or_skip  # beside this file (conftest.py puts the folder on sys.path)

    from genprobe.model.catalog import SMOLLM2
    from genprobe.serving.llamacpp.sampling import LlamaVocab

    llama_cpp_or_skip()  # a module fixture runs before the folder's (function-scoped) skip
    path = SMOLLM2.gguf_path()
    if not path.is_file():
        pytest.skip(f"DRY needs a vocabulary: {path} is missing; run `genprobe fetch smollm2` once")
    with LlamaVocab(path) as vocab:
        yield vocab


def _dry_cfg(vocab, strings, **kw):
    return LLAMA.replace(dry_multiplier=0.8, dry_sequence_breakers=vocab.dry_breakers(strings) if strings else (), **kw)


@pytest.mark.parametrize("allowed", [1, 2, 3])
@pytest.mark.parametrize("last_n", [-1, 8, 12, 40])
@pytest.mark.parametrize("strings", [(), ("\n",), ("\n", ":", '"', "*")], ids=["none", "newline", "defaults"])
def test_dry_with_breakers(smollm2_vocab, allowed, last_n, strings):
    """llama_sampler_dry_apply on real text: "the cat sat on the mat" repeated across a newline; the breaker
    stops the match at the newline (rep_limit), allowed_length and last_n bound it."""
    vocab = smollm2_vocab
    hist = vocab.tokenize(b"a cat sat on the mat\nthe cat sat on the mat\nthe cat sat on the")
    rng = np.random.default_rng(0)
    row = rng.normal(0, 2, vocab.n_tokens).astype(F32)
    row[hist] = 4.0  # the repeat candidates near the top: DRY decides what survives top-k
    cfg = _dry_cfg(vocab, strings, dry_allowed_length=allowed, dry_last_n=last_n, dry_base=1.75, top_k=30)
    agree(row, hist, cfg, vocab=vocab, dry_breaker_strings=strings)


def test_dry_breaker_inside_the_repeat_changes_the_penalty(smollm2_vocab):
    """The same history with and without ':' as a breaker: the repeat "x: y z" is cut only with it."""
    vocab = smollm2_vocab
    hist = vocab.tokenize(b"alpha beta: gamma delta alpha beta: gamma delta alpha beta: gamma")
    row = np.zeros(vocab.n_tokens, dtype=F32)
    with_colon = agree(row, hist, _dry_cfg(vocab, (":",)), vocab=vocab, dry_breaker_strings=(":",))
    without = agree(row, hist, _dry_cfg(vocab, ()), vocab=vocab)
    nxt = vocab.tokenize(b" delta")[0]
    assert with_colon.as_dict()[nxt] > without.as_dict()[nxt]  # the colon cut the repeat short: smaller penalty


def test_dry_breaker_strings_must_match_the_config(smollm2_vocab):
    """Breakers as token ids in the config and as strings for llama.cpp: a mismatch is refused, named."""
    cfg = _dry_cfg(smollm2_vocab, ("\n",))
    with pytest.raises(UnsupportedSamplerError, match="dry_sequence_breakers"):
        chain_candidates(np.zeros(smollm2_vocab.n_tokens, dtype=F32), [1, 2], cfg, vocab=smollm2_vocab)
    with pytest.raises(UnsupportedSamplerError, match="needs a vocabulary"):
        chain_candidates(np.zeros(8, dtype=F32), [1, 2], LLAMA.replace(dry_multiplier=1.0))


# ---- the whole chain ---------------------------------------------------------------------------------------
def _random_config(rng: np.random.Generator) -> SamplerConfig:
    pick = rng.random
    return SamplerConfig.preset(
        "llama.cpp",
        temperature=float(rng.choice([0.3, 0.8, 1.0, 1.5])),
        top_k=int(rng.choice([0, 1, 3, 40])),
        top_p=float(rng.choice([1.0, 0.95, 0.7, 0.3])),
        min_p=float(rng.choice([0.0, 0.05, 0.2])),
        typical_p=float(rng.choice([1.0, 1.0, 0.9, 0.5])),
        top_n_sigma=float(rng.choice([0.0, 0.0, 1.0, 2.5])),
        repetition_penalty=float(rng.choice([1.0, 1.1, 1.5])) if pick() < 0.6 else 1.0,
        frequency_penalty=float(rng.choice([0.0, 0.3])),
        presence_penalty=float(rng.choice([0.0, 0.5])),
        penalty_last_n=int(rng.choice([64, 8, -1])),
        xtc_probability=float(rng.choice([0.0, 1.0])),
        xtc_threshold=float(rng.choice([0.05, 0.1, 0.3])),
        order=str(rng.choice(["llama.cpp", "llama.cpp", "temp_then_trunc"])),
    )


def test_grid_of_random_settings_on_real_size_rows():
    """200 random settings of the llama.cpp preset (every stage; llama.cpp's order and one moved), on rows of
    1,000 logits with ties and -inf, histories of 100 tokens: the same kept sets and probabilities."""
    rng = np.random.default_rng(32)
    for case in range(200):
        cfg = _random_config(rng)
        row = np.round(rng.normal(0, 3, 1000), 1).astype(F32)  # rounded: many exact ties
        row[rng.integers(0, 1000, 20)] = NEG
        hist = rng.integers(0, 1000, 100).tolist()
        try:
            agree(row, hist, cfg)
        except AssertionError as exc:
            raise AssertionError(f"case {case}: {cfg}") from exc


@pytest.mark.parametrize("p", [0.3, 0.9, 0.999])
def test_top_p_on_a_large_unsorted_array(p):
    """Above 1,024 unsorted candidates llama_sampler_top_p_apply pre-sorts only the top 256 by buckets
    (llama_token_data_array_partial_sort) and sorts everything when the mass is not reached there."""
    rng = np.random.default_rng(7)
    row = np.round(rng.normal(0, 1.5, 5000), 2).astype(F32)
    agree(row, None, LLAMA.replace(top_p=p))
    agree(row, None, LLAMA.replace(top_p=p, min_p=0.01, temperature=0.7))


def test_a_wrong_order_is_caught():
    """The comparison sees the order: the preset (llama.cpp's order: top-p, then temperature) against llama.cpp's
    chain built with temperature first keeps a different set, and :func:`agree` fails on it."""
    cfg = LLAMA.replace(temperature=0.5, top_p=0.8)
    right = chain_candidates(SPREAD, None, cfg)
    wrong = chain_candidates(SPREAD, None, cfg.replace(order="temp_then_trunc"))
    assert set(right.ids.tolist()) != set(wrong.ids.tolist())
    our_ids = set(ours(SPREAD, None, cfg)[0])
    assert our_ids == set(right.ids.tolist()) != set(wrong.ids.tolist())


def test_bans_are_minus_infinity_biases():
    """ban_ids → llama_sampler_init_logit_bias(-INFINITY) first; with penalties and top-k after it."""
    cfg = LLAMA.replace(ban_ids=(4, 0), repetition_penalty=1.3, top_k=3)
    got = agree(SPREAD, [4, 1, 1], cfg)
    assert 0 not in got.ids and 4 not in got.ids


# ---- greedy, temperature 0, and sampling -------------------------------------------------------------------
def test_greedy_is_the_argmax_of_the_adjusted_logits():
    """genprobe's greedy → llama_sampler_init_greedy after penalties (first maximum: the lower id on a tie)."""
    cfg = LLAMA.replace(greedy=True, repetition_penalty=2.0, penalty_last_n=4)
    hist = [0, 2]
    with LlamaCppSampler(cfg, n_vocab=len(EQUAL_MAX), context_length=64) as s:
        s.accept_all(hist)
        theirs = s.sample(EQUAL_MAX)
    ours_ = int(sample_next(torch.from_numpy(EQUAL_MAX)[None], torch.tensor([hist]), cfg)[0])
    assert theirs == ours_ == 0  # 0 and 2 (the maxima) penalised to 2.5, tied with 4 and 5: the first (0) wins


def test_llama_cpp_temperature_zero_is_not_greedy():
    """llama.cpp's own τ = 0 (temp_ext(0)) keeps the first maximum *after* the truncations: typical-p removed the
    argmax here, so it picks another token; genprobe refuses τ = 0 and maps greedy=True to the argmax."""
    row = np.log(np.array([0.4, 0.2, 0.2, 0.2], dtype=F32))
    stages = [ChainStage("typical", (0.5, 0)), ChainStage("temp_ext", (0.0, 0.0, 1.0))]
    from genprobe.serving.llamacpp.engine import require_llama_cpp
    from genprobe.serving.llamacpp.sampling import _CandidateArray, build_chain

    lc = require_llama_cpp()
    chain = build_chain(lc, stages, None, 4)
    try:
        arr = _CandidateArray(lc, row)
        lc.llama_sampler_apply(chain, __import__("ctypes").byref(arr.cur))
        kept = arr.rows()
    finally:
        lc.llama_sampler_free(chain)
    assert [int(i) for i, x in zip(kept["id"], kept["logit"], strict=True) if x != NEG] != [0]
    with pytest.raises(ValueError, match="temperature must be > 0"):
        LLAMA.replace(temperature=0.0)


def test_sampler_draws_follow_the_preset_distribution():
    """LlamaCppSampler's dist draws, 4,000 of them, match genprobe's probabilities (χ² at p ≈ 1e-4)."""
    cfg = SamplerConfig.preset("llama.cpp", top_k=6, top_p=0.99, min_p=0.0)
    _, probs = ours(SPREAD, None, cfg)
    counts = np.zeros(len(SPREAD))
    with LlamaCppSampler(cfg, n_vocab=len(SPREAD), context_length=64, seed=7) as s:
        for _ in range(4000):
            counts[s.sample(SPREAD)] += 1
    expected = np.array([probs.get(i, 0.0) for i in range(len(SPREAD))]) * 4000
    assert counts[expected == 0].sum() == 0
    live = expected > 0
    chi2 = float((((counts - expected) ** 2)[live] / expected[live]).sum())
    assert chi2 < 27.9, (counts, expected)  # df = 5, p = 1e-4


def test_sampler_lifetime_and_input_checks():
    """accept → sample without re-accepting; reset forgets; closed means closed; a wrong row size is named."""
    cfg = LLAMA.replace(greedy=True, repetition_penalty=100.0, penalty_last_n=8)
    row = np.array([0.0, 3.0, 2.0], dtype=F32)
    s = LlamaCppSampler(cfg, n_vocab=3, context_length=8)
    assert s.sample(row) == 1
    s.accept(1)
    assert s.sample(row) == 2  # 1 penalised
    s.reset()
    assert s.sample(row) == 1
    with pytest.raises(ValueError, match="vocabulary of 3"):
        s.sample(np.zeros(4, dtype=F32))
    s.close()
    s.close()
    with pytest.raises(UnsupportedSamplerError, match=r"ban_ids \[3\] are outside the vocabulary of 3"):
        LlamaCppSampler(cfg.replace(ban_ids=(3,)), n_vocab=3, context_length=8)
    with pytest.raises(ValueError, match="closed"):
        s.sample(row)


@pytest.mark.parametrize(
    "cfg, match",
    [
        (LLAMA.replace(no_repeat_ngram=3), "no_repeat_ngram"),
        (LLAMA.replace(top_k=4, penalty_alpha=0.6), "contrastive"),
        (SamplerConfig(top_k=5, engine="hf", order="hf"), "engine='hf'"),
        (SamplerConfig(top_p=0.9), "engine='genprobe'"),
    ],
)
def test_refused_settings_name_the_setting(cfg, match):
    """What llama.cpp has no sampler for (or computes differently) is refused with the setting's name."""
    with pytest.raises(UnsupportedSamplerError, match=match):
        chain_stages(cfg, context_length=64)


def test_plain_greedy_or_sampling_maps_from_any_engine():
    """No arithmetic stage active: any engine's config is llama.cpp's chain (bans and τ = 1 are exact)."""
    assert chain_stages(SamplerConfig(greedy=True, ban_ids=(2,)), context_length=8)[-1] == ChainStage("greedy", ())
    agree(SPREAD, None, SamplerConfig(ban_ids=(0,), engine="genprobe"))
