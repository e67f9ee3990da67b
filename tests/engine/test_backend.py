"""The backend protocol (issue #45): genprobe's own engine as a backend runs the live verifier (issue #47) without a
server — every phase it can check passes exactly (it is the reference), the others say why they were not checked."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "matrix"))
from command_cells import save_tiny_llama  # noqa: E402

from genprobe.engine.backend import EngineBackend, Request  # noqa: E402
from genprobe.engine.samplers.stages import SamplerConfig  # noqa: E402
from genprobe.serving.verify import NOT_CHECKED, Settings, verify_backend  # noqa: E402


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from genprobe.model.load import load_model

    return load_model(save_tiny_llama(tmp_path_factory.mktemp("backend"))[0])


def test_the_engine_backend_is_its_own_reference(model):
    report = verify_backend(EngineBackend(model), model, "tiny", Settings(requests=8, steps=4, top_k=3))
    got = {p.phase: p for p in report.phases}
    for name in ("prompt", "greedy"):
        assert got[name].verdict == "pass" and got[name].max_abs_dlogp == 0.0, got[name]
        assert got[name].top1_agreement == 1.0 and got[name].topk_agreement == 1.0
    assert got["prefix"].verdict == "pass" and got["seed"].verdict == "pass" and got["limits"].verdict == "pass"
    assert got["batch"].verdict == NOT_CHECKED and got["batch"].note == "the backend serves one request at a time"
    assert got["chat"].verdict == NOT_CHECKED and "no endpoint that returns the prompt ids" in got["chat"].note
    assert report.verdict == "pass"


def test_the_engine_backend_refuses_what_it_cannot_do(model):
    backend = EngineBackend(model)
    with pytest.raises(ValueError, match="token-id prompts"):
        backend.complete(Request("text", 2))
    with pytest.raises(ValueError, match="not min_p"):  # a request carries only what the OpenAI API does
        backend.complete(Request((1, 2), 2, SamplerConfig(min_p=0.1)))


def test_the_engine_backend_samples_with_the_engines_own_chain(model):
    """A request carries the SamplerConfig the engine samples with: top-k 1 is the argmax, a seed repeats its draws."""
    backend, prompt = EngineBackend(model), (1, 2, 3)
    greedy = backend.complete(Request(prompt, 6)).token_ids
    assert backend.complete(Request(prompt, 6, SamplerConfig(temperature=5.0, top_k=1), seed=3)).token_ids == greedy
    hot = SamplerConfig(temperature=5.0)
    assert backend.complete(Request(prompt, 6, hot, seed=3)) == backend.complete(Request(prompt, 6, hot, seed=3))


class _NothingCached(EngineBackend):
    """Says it served 0 prompt tokens from a cache (vLLM's CPU cache with a block longer than the shared prefix)."""

    def complete(self, request):
        response = super().complete(request)
        response.cached_tokens = 0
        return response


def test_a_prefix_cache_that_served_nothing_is_not_checked(model):
    """A check with nothing to look at says "not checked", never "pass"."""
    report = verify_backend(_NothingCached(model), model, "tiny", Settings(requests=8, steps=4, top_k=3))
    prefix = next(p for p in report.phases if p.phase == "prefix")
    assert prefix.verdict == NOT_CHECKED and "its prefix cache was not exercised" in prefix.note, prefix
