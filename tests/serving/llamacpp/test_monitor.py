"""The online loop monitor through llama-cpp-python's own hooks (``stopping_criteria``, ``logits_processor``) on a
tiny random Llama (F32 GGUF): the stop cuts the generation right after the step the offline replay reports, the
breaker bans the loop's continuation at the next step, and a prompt that never loops is left alone.

Skipped with the reason (conftest) when llama.cpp's bindings are not installed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from models import tiny_llama_gguf  # noqa: E402

from genprobe._io import json_safe

STEPS = 40


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from genprobe.serving.llamacpp.engine import LlamaCppModel

    _, gguf = tiny_llama_gguf(tmp_path_factory.getbasetemp() / "llamacpp-tiny")
    with LlamaCppModel(gguf, n_ctx=64, kv_type="f32") as m:
        yield m


@pytest.fixture(scope="module")
def cases(engine):
    """(prompt, greedy tokens, the offline replay's detection) for prompts that loop and for ones that do not."""
    from genprobe.serving.monitor import replay

    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(3, 96, n)] for n in rng.integers(1, 12, 12)]
    out = []
    for p in prompts:
        g = engine.greedy(p, STEPS, stop_at_eos=False, ban_ids=(engine.eos_id,))
        out.append((p, g, replay(g)))
    assert any(d is not None for _, _, d in out) and any(d is None for _, _, d in out)
    return out


def _generate(engine, prompt, **hooks):
    import llama_cpp

    kw = {}
    if "stop" in hooks:
        kw["stopping_criteria"] = llama_cpp.StoppingCriteriaList([hooks["stop"]])
    if "breaker" in hooks:
        kw["logits_processor"] = llama_cpp.LogitsProcessorList([hooks["breaker"], _ban(engine.eos_id)])
    else:
        kw["logits_processor"] = llama_cpp.LogitsProcessorList([_ban(engine.eos_id)])
    engine.reset()
    gen = engine.llama.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, **kw)
    toks = []
    for t in gen:
        toks.append(int(t))
        if len(toks) == STEPS:
            break
    gen.close()
    return toks


def _ban(token):
    def ban(input_ids, scores):
        scores[token] = -np.inf
        return scores

    return ban


def test_the_stop_cuts_right_after_the_step_replay_reports(engine, cases):
    from genprobe.serving.monitor import LlamaCppLoopStopping

    for prompt, greedy, detection in cases:
        stop = LlamaCppLoopStopping()
        toks = _generate(engine, prompt, stop=stop)
        if detection is None:
            assert toks == greedy and stop.detection is None  # never fires on a prompt that does not loop
        else:
            assert toks == greedy[: detection.step + 1]
            assert json_safe(stop.detection) == json_safe(detection)
        stop.reset()
        assert stop.detection is None


def test_the_breaker_bans_the_continuation_at_the_next_step(engine, cases):
    from genprobe.serving.monitor import LlamaCppLoopBreaker

    looped = [(p, g, d) for p, g, d in cases if d is not None]
    changed = 0
    for prompt, greedy, detection in looped:
        breaker = LlamaCppLoopBreaker()
        toks = _generate(engine, prompt, breaker=breaker)
        k = detection.step + 1  # the first token sampled after the loop was seen
        assert toks[:k] == greedy[:k]  # nothing changes before the loop
        continuation = toks[k - detection.period]
        assert toks[k] != continuation  # banned at the very next step
        assert breaker.interventions >= 1
        changed += greedy[k] == continuation  # where greedy would have continued the loop, the breaker changed it
    assert changed >= 1
