"""llama.cpp as an engine (LlamaCppModel) on a tiny random Llama converted by llama.cpp's own converter to F32:
its logits at every position against float32 recomputation, its decode path against its prefill, several sequences
in one context, greedy generation against our engine, and the refusals.

Skipped with the reason (conftest) when llama.cpp's bindings are not installed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from models import tiny_llama_gguf  # noqa: E402

NOISE = 1e-4  # verify-cache's float-noise threshold on |Δ log p|


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(transformers directory, F32 GGUF) of the tiny Llama; built once per session."""
    return tiny_llama_gguf(tmp_path_factory.getbasetemp() / "llamacpp-tiny")


@pytest.fixture(scope="module")
def engine(tiny):
    from genprobe.serving.llamacpp.engine import LlamaCppModel

    with LlamaCppModel(tiny[1], n_ctx=64, kv_type="f32") as m:
        yield m


@pytest.fixture(scope="module")
def reference(tiny):
    import genprobe
    from genprobe.serving.judge import reference_logprobs

    torch.set_num_threads(1)
    return reference_logprobs(genprobe.load(str(tiny[0])))


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def _ids(n: int, seed: int = 0) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, 96, n)]


def test_logits_at_every_position_equal_float32_recomputation(engine, reference):
    ids = _ids(40)
    got = engine.logits(ids)
    assert got.shape == (40, engine.vocab_size) and got.dtype == np.float32
    ref = reference(ids).numpy()
    assert np.abs(_log_softmax(got) - ref).max() < NOISE
    assert (got.argmax(-1) == ref.argmax(-1)).all()
    # a fresh cache every call: the same ids again give the same rows, whatever ran before
    engine.logits(_ids(30, seed=1))
    assert np.array_equal(engine.logits(ids), got)


def test_token_by_token_decode_equals_the_one_call_prefill(engine):
    ids = _ids(33, seed=2)
    engine.reset()
    stepwise = np.concatenate([engine.decode([t], i, logits="all") for i, t in enumerate(ids)])
    assert np.abs(stepwise - engine.logits(ids)).max() < 1e-4


def test_sequences_of_one_batch_equal_each_sequence_alone(engine):
    from genprobe.serving.llamacpp.engine import greedy_picker

    prompts = [_ids(n, seed=n) for n in (1, 5, 17)]  # a one-token prompt: the hardest length
    out = engine.generate_batch(prompts, 6, greedy_picker(), keep_logits=True)
    for p, g in zip(prompts, out, strict=True):
        assert g.prompt == p and len(g.tokens) == 6
        assert g.logits.shape == (len(p) + 5, engine.vocab_size)
        alone = engine.logits(p + g.tokens)[: len(p) + 5]
        assert np.abs(g.logits - alone).max() < 1e-4
        assert g.tokens == engine.greedy(p, 6, stop_at_eos=False)


def test_greedy_equals_our_engine_on_the_same_weights(engine, tiny):
    import genprobe
    from genprobe.engine.generate import generate
    from genprobe.engine.samplers.stages import SamplerConfig

    prompt = _ids(7, seed=3)
    ours = generate(genprobe.load(str(tiny[0])), [prompt], 20, SamplerConfig(greedy=True, ban_ids=(2,)))
    assert engine.greedy(prompt, 20, ban_ids=(2,)) == ours.tokens[0]


def test_greedy_picker_ties_bans_and_minus_inf():
    from genprobe.serving.llamacpp.engine import greedy_picker

    row = np.array([0.5, 2.0, 2.0, -np.inf, 1.0], dtype=np.float32)
    assert greedy_picker()(row, []) == 1  # a tie: the lowest id, as torch.argmax and llama.cpp's greedy
    assert greedy_picker([1])(row, []) == 2
    assert greedy_picker([1, 2])(row, []) == 4
    # everything -inf once banned: argmax's answer (id 0, banned or not), exactly what torch.argmax and llama.cpp's
    # greedy sampler (the first maximum in array order) return, so the engines stay token-identical
    masked = torch.tensor(row).clone()
    masked[[0, 1, 2, 4]] = -torch.inf
    assert greedy_picker([0, 1, 2, 4])(row, []) == int(torch.argmax(masked)) == 0
    assert row[1] == 2.0  # the caller's row is not modified


def test_refusals_name_the_problem_and_the_limit(engine, tmp_path):
    from genprobe.serving.llamacpp.engine import LlamaCppModel

    with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 96\)"):
        engine.logits([5, engine.vocab_size])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.logits([-1])
    with pytest.raises(ValueError, match="exceed n_batch=256"):
        engine.decode([5] * 257, 0)
    with pytest.raises(ValueError, match="context overflow"):
        engine.greedy([5] * 250, 7)
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGML0000")
    with pytest.raises(ValueError, match="not a GGUF file"):
        LlamaCppModel(bad)
    with pytest.raises(FileNotFoundError):
        LlamaCppModel(tmp_path / "missing.gguf")
    with pytest.raises(ValueError, match="kv_type"):
        LlamaCppModel(bad, kv_type="q8_0")


def test_context_is_rounded_as_llama_cpp_rounds_it_and_described(engine, tiny):
    assert engine.n_ctx == 256 and engine.n_batch == 256  # asked for 64: llama.cpp pads to a multiple of 256
    d = engine.describe()
    assert d["tensor_types"] == {"F32": sum(d["tensor_types"].values())}
    assert d["llama_cpp_python"] == "0.3.36" and d["kv_type"] == "f32" and d["n_threads"] == 1
    assert engine.tokenize("the cat", add_bos=True)[0] == engine.bos_id == 1
    assert engine.detokenize(engine.tokenize("the cat", add_bos=False)).strip() == "the cat"


def test_requests_in_one_context_equal_each_request_alone(engine):
    """The backend's batch runs the one decode loop with each request's own budget, bans, EOS and stop string:
    token for token what each request gives on its own, the same finish reasons and text."""
    from genprobe.engine.backend import Request
    from genprobe.engine.samplers.stages import SamplerConfig
    from genprobe.serving.llamacpp.engine import LlamaCppBackend

    backend = LlamaCppBackend(engine)
    prompts = [tuple(_ids(n, seed=10 + n)) for n in (3, 9, 14)]
    alone_text = backend.complete(Request(prompts[2], 12, read_cache=False)).text
    stop = alone_text[len(alone_text) // 2 :][:2]
    requests = [
        Request(prompts[0], 5, read_cache=False),
        Request(prompts[1], 9, SamplerConfig(greedy=True, ban_ids=(2, 7)), read_cache=False),
        Request(prompts[2], 12, stop=(stop,), read_cache=False),
    ]
    together = backend.complete_many(requests, 3)
    for r, got in zip(requests, together, strict=True):
        want = backend.complete(r)
        assert (got.token_ids, got.finish_reason, got.text) == (want.token_ids, want.finish_reason, want.text)
        assert torch.allclose(got.rows, want.rows, atol=1e-4)
    assert together[2].finish_reason == "stop" and stop not in together[2].text
    assert not set(together[1].token_ids) & {2, 7}
