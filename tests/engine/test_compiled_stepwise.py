"""Large decode steps compiled one step per call (weights frozen and packed for oneDNN) with a compiled prefill, and
which compiled configuration the size of a step selects (threads, loop or stepwise).

Split from test_compiled_decode.py so that the two run on two workers (tests/conftest.py: XDIST_GROUPS): each file
compiles its own graphs. The AOT programs (genprobe.engine.fast.aot) are turned off, as there.
"""

from __future__ import annotations

import pytest
import torch

from genprobe._io import json_safe
from genprobe.engine.fast import compiled as compiled_mod
from genprobe.engine.generate import generate


@pytest.fixture(autouse=True)
def _torch_compile_path(monkeypatch):
    """Decode through torch.compile, not the AOT programs (which take the loop-strategy shapes when they can)."""
    monkeypatch.setenv(compiled_mod.AOT_ENV, "0")


class _Sized:
    """Stands in for a model of ``n`` parameters where only the size matters."""

    def __init__(self, n, weight_dtype=torch.float32):
        self.n = n
        self.wte = torch.nn.Embedding(1, 1)  # float32, as the kernels' check reads it
        self.linear_weight = torch.zeros(1, 1, dtype=weight_dtype)  # weight-only narrow linear layers or not

    def num_parameters(self):
        return self.n

    def parameters(self):
        return iter([self.wte.weight, self.linear_weight])


def _max_diff(a, b) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a.step_logits, b.step_logits, strict=True))


def test_threads_follow_the_size_of_a_step():
    assert compiled_mod.compile_config(_Sized(427_264), 1)["cpp.threads"] == 1
    assert compiled_mod.compile_config(_Sized(57_750_528), 1)["cpp.threads"] == -1  # 231 MB of weights: every core


def _spy_kinds(monkeypatch) -> list[str]:
    """Record which compiled function ("loop", "stepwise", "prefill") every compiled call ran."""
    kinds: list[str] = []
    real = compiled_mod.compiled_fn

    def spy(kind):
        kinds.append(kind)
        return real(kind)

    monkeypatch.setattr(compiled_mod, "compiled_fn", spy)
    return kinds


def test_the_strategy_follows_the_measured_work_of_a_step():
    """docs/speed.md: the loop wins for small steps, one compiled step per call for large ones."""

    small, large = _Sized(427_264), _Sized(57_750_528)
    assert [compiled_mod.decode_strategy(small, b) for b in (1, 16, 64)] == ["loop", "loop", "stepwise"]
    assert [compiled_mod.decode_strategy(large, b) for b in (1, 16, 64)] == ["loop", "stepwise", "stepwise"]


@pytest.mark.parametrize("dtype", [torch.int8, torch.bfloat16])
def test_narrow_weights_stay_on_the_kernels_where_the_stepwise_path_would_widen_them(dtype):
    """Freezing for oneDNN widens weight-only weights to float32 once; the kernels read them narrow (measured:
    57.8M int8 at batch 16, 867 vs ~700 tok/s). Beyond the kernels' rows the stepwise path is all there is."""
    large = _Sized(57_750_528, dtype)
    assert [compiled_mod.decode_strategy(large, b) for b in (1, 16, 64, 65)] == ["loop", "loop", "loop", "stepwise"]


@pytest.fixture(scope="module")
def stepwise_model(sharp_gpt):
    """One model for the file's compiled tests, in their order: its frozen graphs (weights are their constants, so
    a model of its own would compile them again, ~20 s of a core each) serve the later tests; the in-place edit
    comes last."""
    return sharp_gpt(0)


@pytest.fixture
def graph_caches_off():
    """The graph caches (Inductor's and AOTAutograd's) off for one test: a graph served from them skips the pattern
    matcher, whose counters show the weight packing. The compiled C++ is still reused: ``force_disable_caches`` would
    rebuild all of it in a fresh cache (~70 s). (config.patch: monkeypatch's undo deletes the entry from the config.)"""
    with torch._inductor.config.patch(fx_graph_cache=False), torch._functorch.config.patch(enable_autograd_cache=False):
        yield


def test_stepwise_decoding_equals_eager_on_a_padded_batch_with_eos(
    monkeypatch, graph_caches_off, sharp_gpt, stepwise_model
):
    """Tokens, finish reasons, raw logits, on_token and forward counts equal the eager loop's; the batch is a
    symbol (one graph for batch 3 and 2) and the frozen weights were packed (what makes the path fast)."""
    from torch._dynamo.utils import counters

    # First a small model's compiled prefill in this process (its products on genprobe's kernels): Inductor sets
    # up its weight-packing patterns once per process, and that compile must not leave them switched off.
    generate(sharp_gpt(9), [[1, 2, 3]], 3, compile=True)
    monkeypatch.setattr(compiled_mod, "STEPWISE_MIN_WORK", 0)
    model = stepwise_model  # first use: nothing compiled for it yet
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
    plain = generate(model, prompts, 20).tokens
    eos = [t for t in plain[0][1:] if all(t in row[1:] for row in plain)][0]
    kinds = _spy_kinds(monkeypatch)
    packed = counters["inductor"]["mkldnn_linear_weight_pack_matcher_count"]
    seen_a, seen_b = [], []
    kw = dict(eos_id=eos, return_logits=True)
    before = counters["stats"]["unique_graphs"]
    a = generate(model, prompts, 20, compile=True, on_token=lambda i, t: seen_a.append(t), **kw)
    # Two graphs, the prefill's and one step's for every cache length: the slots attention reads are a symbol.
    assert counters["stats"]["unique_graphs"] == before + 2
    b = generate(model, prompts, 20, on_token=lambda i, t: seen_b.append(t), **kw)
    assert compiled_mod.compile_error() is None
    assert set(kinds) == {"prefill", "stepwise"}  # no "loop": the compiled step ran, driven from Python
    assert counters["inductor"]["mkldnn_linear_weight_pack_matcher_count"] > packed, dict(counters["inductor"])
    assert a.tokens == b.tokens and a.finished == b.finished == ["eos"] * 3 and seen_a == seen_b
    assert _max_diff(a, b) < 1e-4 and a.forward_calls == b.forward_calls and a.token_forwards == b.token_forwards
    graphs = counters["stats"]["unique_graphs"]
    c = generate(model, prompts[:2], 12, compile=True, return_logits=True)
    d = generate(model, prompts[:2], 12, return_logits=True)
    assert c.tokens == d.tokens and _max_diff(c, d) < 1e-4
    # Batch 2: one new graph, the prefill's (its batch size stays static); the decode step is reused.
    assert counters["stats"]["unique_graphs"] == graphs + 1


def test_stepwise_path_passes_the_cache_verifier(monkeypatch, stepwise_model, traced_only):
    """The verifier's harness (decode, prefill in chunks of 4, padded batch) on the stepwise path and prefill."""
    from genprobe.verify.adapters import CompiledEngineAdapter, FullRecompute
    from genprobe.verify.harness import ReferenceRun, VerifyOptions, verify_implementation

    monkeypatch.setattr(compiled_mod, "STEPWISE_MIN_WORK", 0)
    model = stepwise_model
    prompts = [[1, 2, 3, 4, 5, 6, 7], [8, 9]]
    kinds = _spy_kinds(monkeypatch)
    rep = verify_implementation(
        CompiledEngineAdapter(model),
        ReferenceRun(FullRecompute(model), 12),
        prompts,
        VerifyOptions(max_new_tokens=12, chunk_sizes=[1, 4]),
    )
    assert rep.verdict == "pass", json_safe(rep)
    assert {"prefill", "stepwise"} <= set(kinds)


# Last in the file: it edits the shared model's weights.
def test_stepwise_decoding_picks_up_weights_edited_in_place(monkeypatch, stepwise_model, traced_only):
    monkeypatch.setattr(compiled_mod, "STEPWISE_MIN_WORK", 0)
    model = stepwise_model
    prompts = [[1, 2, 3], [4, 5]]
    generate(model, prompts, 10, compile=True)  # compiled for the weights before the edit (or reused)
    with torch.no_grad():
        model.h[0].mlp.c_fc.weight.mul_(1.5)
    a = generate(model, prompts, 10, compile=True, return_logits=True)
    b = generate(model, prompts, 10, return_logits=True)
    assert a.tokens == b.tokens and _max_diff(a, b) < 1e-4
