"""Compiled decoding through torch.compile (the model's one forward over a StaticKVCache) equals eager decoding.

This is the path that decodes where the ahead-of-time programs (genprobe.engine.fast.aot, tested in
test_aot_decode.py) do not apply or cannot be built, so every test here turns them off. A test of Inductor's code
pays one build per model and weights (frozen graphs hold the weights: 10-15 s of a core each, cold); the tests of
the path's own logic (padding, eos, hooks, limits, graphs per situation) take the ``traced_only`` fixture (Dynamo
traces the same functions, PyTorch's eager kernels run them: ~1 s). The file runs on one worker
(tests/conftest.py: XDIST_GROUPS); the large-step tests are in test_compiled_stepwise.py.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from genprobe._io import json_safe
from genprobe.engine.fast import compiled as compiled_mod
from genprobe.engine.fast.static_cache import StaticKVCache
from genprobe.engine.generate import generate
from genprobe.engine.samplers.stages import SamplerConfig


@pytest.fixture(autouse=True)
def _torch_compile_path(monkeypatch):
    """Decode through torch.compile, not the AOT programs (which take these shapes when they can)."""
    monkeypatch.setenv(compiled_mod.AOT_ENV, "0")


def _scaled_model(seed: int = 0, **kw):
    """A small random GPT with trained-scale logits (see tests/verify/conftest.py), so a wrong key shows."""
    from genprobe.model.config import GPTConfig
    from genprobe.model.gpt import GPT

    torch.manual_seed(seed)
    cfg = dict(vocab_size=50, n_layer=2, n_head=2, d_model=32, d_ff=64, block_size=32) | kw
    model = GPT(GPTConfig(**cfg))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(10)
    return model.eval()


def _max_diff(a, b) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a.step_logits, b.step_logits, strict=True))


def test_static_cache_overflow_is_a_value_error_naming_capacity(tiny_model):
    cache = StaticKVCache.for_model(tiny_model.cfg, 1, max_len=5)
    with torch.inference_mode():
        tiny_model(torch.tensor([[1, 2, 3, 4]]), cache=cache)
        with pytest.raises(ValueError, match="capacity 5"):
            tiny_model(torch.tensor([[1, 2]]), cache=cache)
        cache.reset()
        assert cache.length == 0 and not bool(cache.valid.any())


def test_without_a_cxx_compiler_it_warns_once_and_decodes_eagerly(monkeypatch):
    """The real failure: Inductor finds no working C++ compiler. Same tokens, eagerly; one warning per process."""
    from genprobe.model.config import GPTConfig
    from genprobe.model.gpt import GPT

    real = compiled_mod.compile_config
    no_cxx = {"cpp.cxx": ("no-such-cxx-compiler",)}
    monkeypatch.setattr(compiled_mod, "compile_config", lambda m, b: {**real(m, b), **no_cxx})
    real_prefill = compiled_mod.prefill_config  # the prompt's graph too: it is compiled first
    monkeypatch.setattr(compiled_mod, "prefill_config", lambda m: {**real_prefill(m), **no_cxx})
    monkeypatch.setattr(compiled_mod, "_compile_error", None)
    # torch.compile's path only: the ahead-of-time programs (their own build, tested in test_aot_decode.py) would
    # otherwise be built first for this shape, with the real compiler, and cost this test ~25 s
    monkeypatch.setenv(compiled_mod.AOT_ENV, "0")
    torch.manual_seed(1)  # a model of its own, so no graph compiled earlier in the session can serve it
    model = GPT(GPTConfig(vocab_size=50, n_layer=1, n_head=2, d_model=16, d_ff=32, block_size=16)).eval()
    with pytest.warns(RuntimeWarning, match="No working C\\+\\+ compiler"):
        a = generate(model, [[1, 2, 3]], 8, compile=True, return_logits=True)
    assert "no-such-cxx-compiler" in compiled_mod.compile_error()
    b = generate(model, [[1, 2, 3]], 8, return_logits=True)
    assert a.tokens == b.tokens and _max_diff(a, b) < 1e-5
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # tried once per process, then eager without a new warning
        generate(model, [[1, 2, 3]], 8, compile=True)


def test_errors_that_are_not_compilation_failures_propagate(tiny_model, monkeypatch):
    """Only Dynamo/Inductor failures fall back to eager; anything else is a bug to surface, not hide."""

    def broken(kind):
        def fn(*a, **k):
            raise KeyError("a bug, not a missing compiler")

        return fn

    monkeypatch.setattr(compiled_mod, "compiled_fn", broken)
    monkeypatch.setattr(compiled_mod, "_compile_error", None)
    with pytest.raises(KeyError, match="a bug"):
        generate(tiny_model, [[1, 2, 3]], 4, compile=True)
    assert compiled_mod.compile_error() is None


def test_compiled_runner_checks_limits_the_graph_skips(tiny_model, traced_only):
    runner = compiled_mod.CompiledGPTRunner(tiny_model)
    state = runner.new_state(1, 4)
    assert state.capacity == tiny_model.cfg.block_size == 32  # rounded up: see static_capacity
    with torch.inference_mode():
        runner.step(torch.arange(1, 33)[None, :] % 50, None, state)
        with pytest.raises(ValueError, match="capacity 32"):
            runner.step(torch.tensor([[1]]), None, state)
        state = runner.new_state(1, 8)
        runner.step(torch.tensor([[1, 2]]), None, state)
        with pytest.raises(ValueError, match=r"token id out of range \[0, 50\)"):
            runner.step(torch.tensor([[50]]), None, state)


@pytest.mark.parametrize(
    "kw, needle",
    [({"mode": "naive"}, "does not apply to mode='naive'")],
)
def test_compile_argument_errors(tiny_model, kw, needle):
    with pytest.raises(ValueError, match=needle):
        generate(tiny_model, [[1, 2]], 3, compile=True, **kw)


def test_every_program_is_built_without_line_tables(tiny_model):
    """Line tables (-g1) serve profilers only and cost 7-9% of each C++ compile: every Inductor setting of the
    compiled path (loop, prompt, large-batch step, AOT programs) turns them off."""
    from genprobe.engine.fast import aot

    configs = [
        compiled_mod.compile_config(tiny_model, 1),
        compiled_mod.prefill_config(tiny_model),
        compiled_mod.stepwise_config(),
        aot._inductor_config(tiny_model, 1, 1),
        aot._inductor_config(tiny_model, None, 1),
    ]
    assert all(cfg.get("aot_inductor.enable_line_tables") is False for cfg in configs)


def test_the_traced_only_backend_runs_no_inductor_build_and_a_wrong_name_is_an_error(tiny_model, monkeypatch):
    """GENPROBE_COMPILE_BACKEND=aot_eager: Dynamo traces the loop, eager kernels run it, Inductor is never called
    (what the traced_only fixture's tests rely on to be cheap); an unknown backend is named with the choices."""
    import torch._inductor.compile_fx as compile_fx

    def no_inductor(*a, **k):
        raise AssertionError("Inductor was asked to compile")

    monkeypatch.setenv(compiled_mod.BACKEND_ENV, "aot_eager")
    monkeypatch.setattr(compile_fx, "compile_fx", no_inductor)
    assert not compiled_mod.uses_aot(tiny_model, 1)  # the AOT programs are Inductor's too
    a = generate(tiny_model, [[1, 2, 3], [4, 5]], 6, compile=True, return_logits=True)
    assert compiled_mod.compile_error() is None
    b = generate(tiny_model, [[1, 2, 3], [4, 5]], 6, return_logits=True)
    assert a.tokens == b.tokens and _max_diff(a, b) < 1e-5
    monkeypatch.setenv(compiled_mod.BACKEND_ENV, "tensorrt")
    with pytest.raises(
        ValueError, match="GENPROBE_COMPILE_BACKEND must be one of inductor, aot_eager, eager; got 'tensorrt'"
    ):
        generate(tiny_model, [[1, 2, 3]], 2, compile=True)


def test_compile_refuses_models_outside_genprobe_and_the_llama_family(tiny_model):
    from genprobe.engine.hf_adapter import HFCausalLM
    from genprobe.model.hf import to_hf_gpt2

    with pytest.raises(ValueError, match="model_type 'gpt2' is not in the Llama family"):
        generate(HFCausalLM(to_hf_gpt2(tiny_model)), [[1, 2]], 3, compile=True)


@pytest.mark.parametrize("pe", ["rope", "alibi"])
def test_compiled_generation_equals_eager_for_rope_and_alibi(pe, traced_only):
    """The position encodings computed inside the forward (rotations, ALiBi bias) compile to the same logits."""
    model = _scaled_model(pos_encoding=pe)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    a = generate(model, prompts, 20, compile=True, return_logits=True)
    assert compiled_mod.compile_error() is None
    b = generate(model, prompts, 20, return_logits=True)
    assert a.tokens == b.tokens and _max_diff(a, b) < 1e-4


def test_static_capacity_rounds_lengths_up_so_they_share_a_graph():
    assert compiled_mod.static_capacity(11, 64) == 64 and compiled_mod.static_capacity(64, 64) == 64
    assert compiled_mod.static_capacity(11, None) == 64
    assert compiled_mod.static_capacity(65, None) == 128 and compiled_mod.static_capacity(200, None) == 256


def test_static_capacity_is_a_power_of_two_bucket_within_the_context():
    # Not the whole context: the attention of a step reads every slot of the capacity.
    assert compiled_mod.static_capacity(57, 160) == 64 and compiled_mod.static_capacity(64, 160) == 64
    assert compiled_mod.static_capacity(65, 160) == 128 and compiled_mod.static_capacity(129, 160) == 160
    assert compiled_mod.static_capacity(160, 160) == 160 and compiled_mod.static_capacity(3, 32) == 32


def test_prompts_of_other_lengths_reuse_the_compiled_graph(tiny_model, traced_only):
    """Capacity is rounded to the context length: a new prompt length or token count does not recompile."""
    from torch._dynamo.utils import counters

    generate(tiny_model, [[1, 2, 3]], 5, compile=True, return_logits=True)
    before = counters["stats"]["unique_graphs"]
    a = generate(tiny_model, [[4, 5, 6, 7, 8, 9]], 11, compile=True, return_logits=True)
    assert counters["stats"]["unique_graphs"] == before
    b = generate(tiny_model, [[4, 5, 6, 7, 8, 9]], 11, return_logits=True)
    assert a.tokens == b.tokens and _max_diff(a, b) < 1e-5


# ---- the compiled greedy loop (every step after the prefill in one call) -----------------------------
def _spy_calls(monkeypatch) -> list[tuple[int, bool]]:
    """Record (steps asked, logits asked) of every compiled loop call, so a test knows which path ran."""
    calls: list[tuple[int, bool]] = []
    real = compiled_mod.CompiledGPTRunner.decode_greedy

    def spy(self, ids, valid, done, state, steps, eos_id=None, with_logits=False):
        calls.append((steps, with_logits))
        return real(self, ids, valid, done, state, steps, eos_id, with_logits)

    monkeypatch.setattr(compiled_mod.CompiledGPTRunner, "decode_greedy", spy)
    return calls


def test_greedy_loop_equals_eager_on_a_padded_batch_where_every_row_stops_at_eos(monkeypatch, traced_only):
    """One call runs the loop (argmax, eos and padding inside the graph) and stops where the last row ends:
    tokens, finish reasons, raw logits of every step, what on_token sees and the forward count all equal
    the per-step eager loop's."""
    model = _scaled_model(seed=0)  # its rows stop at steps 8, 5 and 17 with this eos
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
    plain = generate(model, prompts, 20).tokens
    common = [t for t in plain[0][1:] if all(t in row[1:] for row in plain)]
    assert common, plain  # a token every row emits after the prefill: all rows stop inside the loop
    eos = common[0]
    calls = _spy_calls(monkeypatch)
    seen_a, seen_b = [], []
    a = generate(
        model, prompts, 20, compile=True, eos_id=eos, return_logits=True, on_token=lambda i, t: seen_a.append((i, t))
    )
    assert compiled_mod.compile_error() is None
    b = generate(model, prompts, 20, eos_id=eos, return_logits=True, on_token=lambda i, t: seen_b.append((i, t)))
    assert calls == [(19, True)]  # every step after the prefill in one compiled call
    assert a.tokens == b.tokens and a.finished == b.finished == ["eos"] * 3
    assert max(len(t) for t in a.tokens) < 20  # stopped early, where the last row hit eos
    assert seen_a == seen_b
    assert len(a.step_logits) == len(b.step_logits) and _max_diff(a, b) < 1e-4
    assert a.forward_calls == b.forward_calls and a.token_forwards == b.token_forwards


def test_greedy_loop_without_logits_or_eos_equals_eager(monkeypatch, traced_only):
    model = _scaled_model(seed=3)
    calls = _spy_calls(monkeypatch)
    a = generate(model, [[1, 2, 3, 4], [5, 6]], 20, compile=True)
    b = generate(model, [[1, 2, 3, 4], [5, 6]], 20)
    assert calls == [(19, False)] and a.tokens == b.tokens


def test_samplers_take_the_one_step_path_of_the_same_loop(monkeypatch, traced_only):
    """A sampled generation calls the compiled loop for one step at a time, with logits."""
    model = _scaled_model(seed=3)
    calls = _spy_calls(monkeypatch)
    s = SamplerConfig(temperature=0.8, top_k=10)
    a = generate(model, [[1, 2, 3]], 6, sampler=s, seed=1, compile=True)
    b = generate(model, [[1, 2, 3]], 6, sampler=s, seed=1)
    assert calls == [(1, True)] * 5 and a.tokens == b.tokens


def test_a_hook_added_between_generations_reaches_the_compiled_graph(traced_only):
    """Guards are skipped for a situation seen before; a new forward hook must not count as seen."""
    model = _scaled_model(seed=4)
    generate(model, [[1, 2, 3]], 12, compile=True, return_logits=True)
    handle = model.h[0].mlp.register_forward_hook(lambda mod, inp, out: out * 3.0)
    try:
        a = generate(model, [[1, 2, 3]], 12, compile=True, return_logits=True)
        b = generate(model, [[1, 2, 3]], 12, return_logits=True)
        assert a.tokens == b.tokens and _max_diff(a, b) < 1e-4
    finally:
        handle.remove()
    c = generate(model, [[1, 2, 3]], 12, compile=True, return_logits=True)
    d = generate(model, [[1, 2, 3]], 12, return_logits=True)
    assert _max_diff(c, d) < 1e-4 and _max_diff(a, c) > 1e-3  # the hook mattered, and its removal too


def test_weights_version_is_unique_to_a_model_object():
    """Two model objects never share a version, even over the very same tensors: ids and addresses of a freed
    model come back for the next one built like it, which must not inherit the freed model's frozen graph."""
    import copy

    a = _scaled_model(seed=1)
    b = copy.copy(a)  # another module object over the same parameter tensors (same ids, addresses, counters)
    assert all(p is q for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert compiled_mod.weights_version(a) != compiled_mod.weights_version(b)
    assert compiled_mod.weights_version(a) == compiled_mod.weights_version(a)  # stable while nothing changes


# ---- the quick-trained checkpoint (a model of the case study's size) -------------------------------------
# Last in the file: where the bundled checkpoint does not fit (another torch) it is trained once per run
# (tests/shared_checkpoint.py); this file's worker compiles the small models' graphs meanwhile instead of waiting.
def test_static_cache_eager_matches_full_recomputation_every_step(trained):
    """The fixed-shape cache (all slots attended, unwritten ones masked) equals recomputation."""
    model, tok, _ = trained
    ids = torch.tensor([tok.encode("白日依山盡，黃河入海流。")])
    with torch.inference_mode():
        full = model(ids)
        cache = StaticKVCache.for_model(model.cfg, 1, max_len=ids.shape[1])
        pre = model(ids[:, :4], cache=cache)
        steps = [model(ids[:, t : t + 1], cache=cache)[:, 0] for t in range(4, ids.shape[1])]
    assert torch.equal(pre, model(ids[:, :4]))  # eager calls attend over written slots only, like KVCache
    assert float((pre - full[:, :4]).abs().max()) < 1e-5
    worst = max(float((s - full[:, 4 + i]).abs().max()) for i, s in enumerate(steps))
    assert worst < 1e-4, worst
    assert cache.length == ids.shape[1]


def test_compiled_generation_equals_eager_greedy_and_sampled_padded_batch(trained):
    """Same tokens and per-step logits within 1e-4: greedy, and a left-padded sampled batch with eos."""
    model, tok, _ = trained
    prompt = tok.encode("白日依山盡，黃")
    a = generate(model, [prompt], 40, compile=True, return_logits=True)
    # Compilation really happened (scripts/setup.sh installs a C++ compiler): not the eager fallback.
    assert compiled_mod.compile_error() is None, compiled_mod.compile_error()
    b = generate(model, [prompt], 40, return_logits=True)
    assert a.tokens == b.tokens
    assert _max_diff(a, b) < 1e-4

    prompts = [tok.encode("春眠"), tok.encode("白日依山盡，黃")]
    s = SamplerConfig(temperature=0.9, top_k=20, repetition_penalty=1.2)
    eos = tok.encode("。")[0]
    a = generate(model, prompts, 30, sampler=s, seed=5, eos_id=eos, compile=True, return_logits=True)
    b = generate(model, prompts, 30, sampler=s, seed=5, eos_id=eos, return_logits=True)
    assert a.tokens == b.tokens and a.finished == b.finished
    assert _max_diff(a, b) < 1e-4


def test_compiled_adapter_passes_the_cache_verifier(trained):
    """The verifier's own harness (decode, chunks of 4, padded batch) judges the compiled path a pass."""
    from genprobe.verify.adapters import CompiledEngineAdapter, FullRecompute
    from genprobe.verify.harness import ReferenceRun, VerifyOptions, verify_implementation

    model, tok, _ = trained
    prompts = [tok.encode("白日依山盡，黃"), tok.encode("春眠")]
    rep = verify_implementation(
        CompiledEngineAdapter(model),
        ReferenceRun(FullRecompute(model), 20),
        prompts,
        VerifyOptions(max_new_tokens=20, chunk_sizes=[1, 4]),
    )
    assert rep.verdict == "pass", json_safe(rep)


def test_weights_edited_in_place_are_picked_up_by_the_compiled_graph(trained):
    """The frozen graph holds the weights: editing them must recompile, not replay stale weights."""
    model, tok, _ = trained
    prompt = tok.encode("白日依山盡，黃")
    # Compiled for the current weights (with logits: the graph the tests above compiled for these weights).
    generate(model, [prompt], 40, compile=True, return_logits=True)
    w = model.h[1].mlp.c_fc.weight
    saved = w.detach().clone()
    try:
        with torch.no_grad():
            w.mul_(1.5)
        a = generate(model, [prompt], 40, compile=True, return_logits=True)
        b = generate(model, [prompt], 40, return_logits=True)
        assert _max_diff(a, b) < 1e-4
    finally:
        with torch.no_grad():
            w.copy_(saved)
