"""A new engine is one adapter (issue #45): a fake backend — genprobe's engine behind the Backend protocol with a
prefix cache and batching of its own — runs verify-serving unchanged; a planted fault in either is caught where it
was planted, and what its capabilities lack is "not checked" with the reason, never "pass"."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "matrix"))
from command_cells import save_tiny_llama  # noqa: E402

from genprobe.engine.backend import EngineBackend, Position, Request, Response  # noqa: E402
from genprobe.serving.judge import NOT_CHECKED  # noqa: E402
from genprobe.serving.verify import Settings, common_prefix, verify_backend  # noqa: E402


class FakeBackend(EngineBackend):
    """Batches up to 4 requests and keeps the last prompt in a token-level prefix cache. ``fault``: "batch" (log-probs
    that depend on how many requests run together) or "stale_cache" (the cache serves the whole previous prompt, and
    its values, to any prompt that starts like it: a lookup on a hash of the first tokens only)."""

    def __init__(self, model, fault: str = ""):
        super().__init__(model, "fake")
        caps = self.capabilities
        self.capabilities = replace(caps, server="fake", concurrency=4, seed=False)
        self.fault, self.last = fault, None

    def complete(self, request: Request, batch: int = 1) -> Response:
        response = super().complete(request)
        if self.fault == "batch" and batch > 1:  # a batched kernel off by a little, more for bigger batches
            response.positions = [_moved(p, 0.3 * batch) for p in response.positions]
        if request.read_cache and self.last is not None:
            cached = common_prefix(self.last.prompt_ids, response.prompt_ids)
            if self.fault == "stale_cache" and cached >= 8 and self.last.prompt_ids != response.prompt_ids:
                cached, response.positions = len(response.prompt_ids) - 1, self.last.positions
            response.cached_tokens = cached
        self.last = response
        return response

    def complete_many(self, requests, concurrency: int) -> list[Response]:
        return [self.complete(r, batch=min(concurrency, 4)) for r in requests]

    def reset_cache(self) -> bool:
        self.last = None
        return True


def _moved(pos: Position, by: float) -> Position:
    logprob = None if pos.logprob is None else pos.logprob - by
    return Position(pos.token, logprob, {t: v - by for t, v in pos.top.items()})


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from genprobe.model.load import load_model

    return load_model(save_tiny_llama(tmp_path_factory.mktemp("fake"))[0])


def _verify(model, fault: str = ""):
    report = verify_backend(FakeBackend(model, fault), model, "tiny", Settings(requests=8, steps=4, top_k=3))
    return report, {p.phase: p for p in report.phases}


def test_the_honest_fake_passes_and_says_what_it_cannot_check(model):
    report, got = _verify(model)
    assert report.verdict == "pass"
    for name in ("prompt", "greedy", "batch", "prefix", "limits"):
        assert got[name].verdict == "pass", got[name]
    assert got["prefix"].cached_tokens == got["prefix"].shared_tokens > 0  # the cache served the shared prefix
    assert got["seed"].verdict == NOT_CHECKED and "no per-request seed" in got["seed"].note
    assert got["prefix_uncached"].verdict == NOT_CHECKED and "skip its prefix cache" in got["prefix_uncached"].note
    assert got["chunked_prefill"].verdict == NOT_CHECKED and "token budget" in got["chunked_prefill"].note
    assert got["chat"].verdict == NOT_CHECKED


def test_log_probs_that_depend_on_the_batch_are_caught_in_the_batch_phase(model):
    report, got = _verify(model, "batch")
    assert got["batch"].verdict == "bug" and got["batch"].max_abs_dlogp > 1.0, got["batch"]
    assert [n for n, p in got.items() if p.verdict == "bug"] == ["batch"]  # nowhere else
    assert report.verdict == "bug"


def test_a_cache_that_serves_another_prompt_is_caught_in_the_prefix_phase(model):
    report, got = _verify(model, "stale_cache")
    prefix = got["prefix"]
    assert prefix.verdict == "bug" and "reused for a different prompt" in prefix.note, prefix
    assert prefix.cached_tokens > prefix.shared_tokens
    assert got["greedy"].verdict == got["batch"].verdict == "pass"  # the phases that do not read the cache
