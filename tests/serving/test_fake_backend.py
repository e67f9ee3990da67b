"""The loop scan and the online monitor written once against :class:`~genprobe.engine.backend.Backend`: on a
scripted fake (``fake_backend.py``) they find the planted loop, and what the fake's capabilities lack is reported as
not checked rather than guessed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fake_backend import GATE, PERIOD, TRAP, FakeBackend, next_token  # noqa: E402

from genprobe.engine.backend import Request
from genprobe.engine.samplers.stages import SamplerConfig
from genprobe.loops.scan import ScanOptions, backend_batches, backend_engine, scan_batches
from genprobe.serving.monitor import monitor_backend, replay

PROMPTS = [[5, 6, 7], [10, 20, GATE], [1, 2], [GATE], [30, 31, 32, 33]]
LOOPING = [False, True, False, True, False]
NEW = 40


def _greedy(prompt, n):
    out = []
    for _ in range(n):
        out.append(next_token((prompt + out)[-1]))
    return out


def test_the_fake_is_a_backend_with_full_and_prompt_logprobs_and_a_batch_fault():
    fake = FakeBackend()
    req = Request((1, 2, 3), 4, logprobs=5, prompt_logprobs=2)
    out = fake.complete(req)
    assert out.token_ids == [4, 5, 6, 7] and len(out.positions[0].top) == 5
    assert out.prompt_positions[0] is None and out.prompt_positions[1].token == 2
    faulty = FakeBackend(batch_shift=0.5)
    alone, *_ = faulty.complete_many([req], 1)
    together, _ = faulty.complete_many([req, req], 2)
    assert alone.token_ids == together.token_ids  # the same tokens, other log-probabilities
    assert alone.positions[0].logprob != together.positions[0].logprob
    assert fake.complete_many([req, req], 2)[0].positions[0].logprob == out.positions[0].logprob


def test_the_scan_over_a_backend_finds_the_planted_loop():
    fake = FakeBackend()
    res = scan_batches(backend_batches(fake, 2), PROMPTS, ScanOptions(NEW, SamplerConfig(greedy=True), 2, unk_id=None))
    assert [r.tokens for r in res.records] == [_greedy(p, NEW) for p in PROMPTS]
    assert [r.measures.looping for r in res.records] == LOOPING
    assert {r.measures.period for r in res.records if r.measures.looping} == {PERIOD}
    assert res.summary.loop_rate == pytest.approx(2 / 5)
    assert [len(r.prompt) for r in fake.requests] == [len(p) for p in PROMPTS]  # one request per prompt


def test_a_text_only_server_is_scanned_through_its_texts_and_says_what_it_did_not_check():
    fake = FakeBackend(token_prompts=False, seed=False)
    texts = [" ".join(map(str, p)) for p in PROMPTS]
    res = scan_batches(backend_batches(fake), PROMPTS, ScanOptions(NEW, SamplerConfig(greedy=True), unk_id=None), texts)
    assert [r.measures.looping for r in res.records] == LOOPING
    with pytest.raises(ValueError, match="text prompts"):
        scan_batches(backend_batches(fake), PROMPTS, ScanOptions(NEW, SamplerConfig(greedy=True), unk_id=None))
    engine = backend_engine(fake, 2)
    engine.check(SamplerConfig(temperature=0.8), None, 64)
    with pytest.raises(ValueError, match="min_p"):
        engine.check(SamplerConfig(temperature=0.8, min_p=0.1), None, 64)  # refused, never approximated
    _, about = engine.start(None, ScanOptions(NEW), PROMPTS, print)
    assert about["backend"] == "endpoint" and about["server"] == "fake"
    assert [note.split(":")[0] for note in about["not_checked"]] == ["prompt ids", "reproducibility"]


def test_the_monitor_over_a_backend_stops_at_the_planted_loop():
    fake = FakeBackend()
    report = monitor_backend(fake, PROMPTS, NEW, chunk=8, concurrency=2)
    assert [c.detection is not None for c in report.completions] == LOOPING and report.not_checked == []
    for prompt, run in zip(PROMPTS, report.completions, strict=True):
        free = _greedy(prompt, NEW)
        want = replay(free)
        assert run.detection == want
        if want is None:
            assert run.tokens == free and run.generated == NEW and run.finish_reason == "length"
        else:  # cut right after the token that completed the loop, as the engines' stop hooks cut it
            assert run.tokens == free[: want.step + 1] and run.finish_reason == "loop"
            assert run.generated < NEW and run.tokens[-PERIOD:] != [] and TRAP in run.tokens
    assert report.looped == 2 and report.tokens_saved == sum(NEW - c.generated for c in report.completions[1::2])
    assert report.tokens_saved > 0
    # each chunk continues from the prompt and the tokens so far
    first, second = [r for r in fake.requests if r.prompt[: len(PROMPTS[0])] == tuple(PROMPTS[0])][:2]
    assert second.prompt == first.prompt + tuple(_greedy(PROMPTS[0], 8))


def test_the_monitor_on_a_text_only_server_finds_the_loop_but_cannot_stop_early():
    fake = FakeBackend(token_prompts=False, seed=False)
    texts = [" ".join(map(str, p)) for p in PROMPTS]
    report = monitor_backend(fake, texts, NEW, SamplerConfig(temperature=0.7), seed=1, chunk=8)
    assert [note.split(":")[0] for note in report.not_checked] == ["early stop", "reproducibility"]
    greedy = monitor_backend(fake, texts, NEW, chunk=8)
    assert [c.detection is not None for c in greedy.completions] == LOOPING
    assert greedy.tokens_saved == 0 and all(c.requests == 1 for c in greedy.completions)
    with pytest.raises(ValueError, match="text prompts"):
        monitor_backend(fake, PROMPTS, NEW)


def test_loops_scan_runs_on_any_backend_by_its_adapter_alone(trained_ckpt):
    """``scan_loop_settings(backend=...)`` takes a Backend as it is: the prompts encoded by the model's tokenizer, the
    fake's tokens measured and described in the JSON (server, model, nothing left unchecked)."""
    import genprobe

    model = genprobe.load(trained_ckpt)
    fake = FakeBackend()
    settings = {"greedy": SamplerConfig(greedy=True)}
    res = genprobe.scan_loop_settings(model, ["春眠不覺曉", "床前明月光"], settings, ScanOptions(NEW), backend=fake)
    out = res.to_dict(with_records=False)
    assert (out["backend"], out["server"], out["model"], out["not_checked"]) == ("endpoint", "fake", "fake-chain", [])
    records = res.scans["greedy"].records
    assert [r.prompt_ids for r in records] == [list(r.prompt) for r in fake.requests]
    assert [r.tokens for r in records] == [_greedy(r.prompt_ids, NEW) for r in records]
    with pytest.raises(ValueError, match="the fake server cannot run the 'sample' setting exactly: .*min_p"):
        genprobe.scan_loop_settings(
            model, ["春眠"], {"sample": SamplerConfig(min_p=0.1)}, ScanOptions(NEW), backend=fake
        )
