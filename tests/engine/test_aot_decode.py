"""Compiled decoding ahead of time (genprobe.engine.fast.aot: exported programs, AOTInductor, C++ loop) equals eager.

Two shapes (1 and 2 rows of one small model) are compiled once for the whole module and shared by every test; the
compiled programs are cached on disk, so a second run of the suite, and the other test files compiling the same
configuration (tests/engine/conftest.py), reuse them.
"""

from __future__ import annotations

import warnings
import zipfile

import pytest
import torch

from genprobe._io import json_safe
from genprobe.engine.fast import aot as aot_mod
from genprobe.engine.fast import compiled as compiled_mod
from genprobe.engine.fast import kernels
from genprobe.engine.generate import generate
from genprobe.engine.samplers.stages import SamplerConfig

# The AOT programs run on the kernels' library (it holds the C++ loop): without it there is nothing to test here.
_NO_KERNELS = kernels.build.unsupported_reason()
pytestmark = pytest.mark.skipif(_NO_KERNELS is not None, reason=f"genprobe's kernels cannot run here: {_NO_KERNELS}")


@pytest.fixture(scope="module")
def model(sharp_gpt):
    """A small random GPT with trained-scale logits, so a wrong key or a stale weight shows in the tokens."""
    return sharp_gpt(3)


def _decoder(model, batch):
    return compiled_mod._aot_decoders.get(model, {}).get((batch, model.cfg.block_size))


def _max_diff(a, b) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a.step_logits, b.step_logits, strict=True))


def test_generation_runs_through_the_aot_programs_and_equals_eager(model):
    prompts = [[5, 9, 2, 41, 7]]
    a = generate(model, prompts, 20, compile=True, return_logits=True)
    b = generate(model, prompts, 20, return_logits=True)
    assert _decoder(model, 1) is not None  # the AOT path ran, not the torch.compile fallback
    # The prompt went through the prompt program (the head on its last position only): a generation never needs
    # the logits of every position, so the chunk program is not even built.
    assert not _decoder(model, 1).decoder.has_chunk()
    assert a.tokens == b.tokens and a.finished == b.finished
    assert (a.token_forwards, a.forward_calls) == (b.token_forwards, b.forward_calls)
    assert _max_diff(a, b) < 1e-4


def test_the_step_program_calls_the_kernels(model):
    """The compiled step program's C++ calls genprobe's small-M kernel directly (the pass and the shim are wired)."""
    generate(model, [[1, 2]], 2, compile=True)
    step_path = aot_mod.build_program(model, 1, model.cfg.block_size, threads=1, kind="step")
    with zipfile.ZipFile(step_path) as z:
        wrapper = next(n for n in z.namelist() if n.endswith("wrapper.cpp"))
        code = z.read(wrapper).decode()
    assert code.count("aoti_torch_cpu_small_linear(") >= 2 * model.cfg.n_layer + 1


def test_padded_batch_with_eos_and_callbacks_equals_eager(model):
    # Two rows: the batch size the cache verifier's padded phase compiles anyway (one build less for the suite).
    prompts = [[3, 4, 5, 6, 7, 8], [9, 10]]
    probe = generate(model, prompts, 24)
    eos = probe.tokens[1][5]  # a token one row emits mid-generation: rows finish at different steps
    seen = {True: [], False: []}
    kw = dict(eos_id=eos, return_logits=True)
    a = generate(model, prompts, 24, compile=True, on_token=lambda i, t: seen[True].append((i, t)), **kw)
    b = generate(model, prompts, 24, on_token=lambda i, t: seen[False].append((i, t)), **kw)
    assert _decoder(model, 2) is not None
    assert "eos" in a.finished and a.finished == b.finished and a.tokens == b.tokens
    assert seen[True] == seen[False]
    assert _max_diff(a, b) < 1e-4


def test_one_token_prompt_is_a_decode_step(model):
    a = generate(model, [[17]], 10, compile=True, return_logits=True)
    b = generate(model, [[17]], 10, return_logits=True)
    assert a.tokens == b.tokens and _max_diff(a, b) < 1e-4


def test_sampled_generation_steps_through_the_step_program(model):
    cfg = SamplerConfig(temperature=0.9, top_k=20)
    a = generate(model, [[5, 6, 7]], 16, sampler=cfg, seed=4, compile=True, return_logits=True)
    b = generate(model, [[5, 6, 7]], 16, sampler=cfg, seed=4, return_logits=True)
    assert a.tokens == b.tokens and _max_diff(a, b) < 1e-4


def test_weight_edits_are_seen_without_recompiling(model, monkeypatch):
    """The programs read the model's own tensors: an in-place edit shows at once, a replaced tensor is re-bound."""
    prompts = [[2, 3, 4]]
    generate(model, prompts, 4, compile=True)  # built and bound
    monkeypatch.setattr(aot_mod, "_compile", lambda *a, **k: pytest.fail("a weight edit must not recompile"))
    w = model.h[0].mlp.c_proj.weight
    original = w.detach().clone()
    try:
        with torch.no_grad():
            w.add_(3.0)  # in place, as a loop patch is applied
        a, b = (
            generate(model, prompts, 12, compile=True, return_logits=True),
            generate(model, prompts, 12, return_logits=True),
        )
        assert a.tokens == b.tokens and _max_diff(a, b) < 1e-4
        model.h[0].mlp.c_proj.weight = torch.nn.Parameter(original * -1.0)  # a new tensor object
        a, b = (
            generate(model, prompts, 12, compile=True, return_logits=True),
            generate(model, prompts, 12, return_logits=True),
        )
        assert a.tokens == b.tokens and _max_diff(a, b) < 1e-4
    finally:
        model.h[0].mlp.c_proj.weight = torch.nn.Parameter(original)


def test_a_forward_hook_takes_the_torch_compile_path(model, monkeypatch):
    """An exported program cannot run a hook: with one registered, AOT does not apply and the hook still acts."""
    handle = model.h[0].mlp.register_forward_hook(lambda mod, inp, out: out * 3.0)
    try:
        assert not compiled_mod.uses_aot(model, 1)
        with monkeypatch.context() as m:  # the torch.compile path's logic, not Inductor's code (see traced_only)
            m.setenv(compiled_mod.BACKEND_ENV, "aot_eager")
            a = generate(model, [[8, 9, 10]], 6, compile=True, return_logits=True)
        b = generate(model, [[8, 9, 10]], 6, return_logits=True)
        assert a.tokens == b.tokens and _max_diff(a, b) < 1e-4
    finally:
        handle.remove()
    assert compiled_mod.uses_aot(model, 1)


def test_a_failed_build_warns_once_and_decodes_through_torch_compile(monkeypatch, sharp_gpt):
    other = sharp_gpt(5)  # a model of its own (no AOT decoder yet), of the configuration whose graphs the suite has

    def refuse(*a, **k):
        raise RuntimeError("export refused this model")

    monkeypatch.setattr(aot_mod, "build_program", refuse)
    with pytest.warns(RuntimeWarning, match="ahead-of-time compilation failed .*export refused this model"):
        a = generate(other, [[1, 2, 3]], 6, compile=True, return_logits=True)
    b = generate(other, [[1, 2, 3]], 6, return_logits=True)
    assert a.tokens == b.tokens and _max_diff(a, b) < 1e-4
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the failure is remembered for the shape: no second warning
        generate(other, [[1, 2, 3]], 6, compile=True)


def test_programs_are_cached_on_disk(model, monkeypatch):
    generate(model, [[1, 2, 3]], 3, compile=True)
    monkeypatch.setattr(aot_mod, "_compile", lambda *a, **k: pytest.fail("cached programs must not recompile"))
    again = aot_mod.AOTDecoder(model, 1, model.cfg.block_size, threads=1)
    assert sorted(again.decoder.constant_names()) == sorted(_decoder(model, 1).decoder.constant_names())


def test_the_chunk_program_loaded_after_a_replaced_weight_reads_the_new_one(model):
    """The chunk program, loaded on first use, is bound to the tensors the other programs read now (not stale ones)."""
    from genprobe.engine.fast.compiled import CompiledGPTRunner

    generate(model, [[1, 2, 3]], 2, compile=True)
    aot = _decoder(model, 1)
    assert not aot.decoder.has_chunk()  # nothing before this test needed every position's logits at batch 1
    original = model.h[1].attn.c_attn.weight.detach().clone()
    try:
        model.h[1].attn.c_attn.weight = torch.nn.Parameter(original * -2.0)  # a new tensor object
        generate(model, [[1, 2, 3]], 2, compile=True)  # re-binds the step and prompt programs to it
        runner = CompiledGPTRunner.for_model(model)
        ids = torch.tensor([[4, 5, 6, 7, 8]])
        with torch.inference_mode():  # as generate() runs (the runner's pooled caches are inference tensors)
            state = runner.new_state(1, 8)
            got = runner.step(ids, None, state)  # T > 1: the chunk program, loaded now
            runner.release_state(state)
            want = model(ids)
        assert aot.decoder.has_chunk()
        torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    finally:
        model.h[1].attn.c_attn.weight = torch.nn.Parameter(original)


def test_the_cache_verifier_passes_on_the_aot_path(model):
    from genprobe.verify.adapters import CompiledEngineAdapter, FullRecompute
    from genprobe.verify.harness import VerifyOptions, verify_implementation

    report = verify_implementation(
        CompiledEngineAdapter(model),
        FullRecompute(model),
        [[4, 5, 6, 7], [8, 9]],
        VerifyOptions(max_new_tokens=12, chunk_sizes=(1, 4)),
    )
    assert report.verdict == "pass", json_safe(report)
    # Its chunks of 4 need every position's logits: the chunk program was built and bound on first use.
    assert any(d is not None and d.decoder.has_chunk() for d in compiled_mod._aot_decoders[model].values())


def test_generations_in_threads_alongside_other_allocations_equal_eager(model):
    """The C++ loop recycles its buffers through c10's CPU allocator while it runs (decoder.cpp, BlockPool):
    generations in several threads, with the main thread allocating and freeing tensors meanwhile, stay exact."""
    import threading

    prompts = [[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]]
    want = [generate(model, [p], 16, return_logits=True) for p in prompts]
    got: dict[int, list] = {}

    def run(i: int) -> None:
        got[i] = [generate(model, [prompts[i % 2]], 16, compile=True, return_logits=True) for _ in range(5)]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    scratch = [torch.full((n % 7 + 1, 300), float(n)) for n in range(400)]  # sizes the decoder's buffers share
    for t in threads:
        t.join()
    assert all(float(s[0, 0]) == n for n, s in enumerate(scratch))
    for i in range(4):
        for a in got[i]:
            assert a.tokens == want[i % 2].tokens
            assert _max_diff(a, want[i % 2]) < 1e-4


def test_a_loop_scan_through_the_compiled_path_equals_the_eager_scan(model, monkeypatch):
    """``engine_batches(compile=True)`` (``loops scan --compile``): the study's sampler (end and unknown tokens banned)
    stepped through the AOT step program; the same generations, loop measures and rates as the eager scan."""
    from genprobe.loops.scan import ScanOptions, engine_batches, scan_batches

    batches: list[int] = []
    real = compiled_mod.aot_decoder
    monkeypatch.setattr(compiled_mod, "aot_decoder", lambda m, b, *a, **k: batches.append(b) or real(m, b, *a, **k))
    prompts = [[5, 9, 2, 41, 7], [3, 4, 5, 6], [9, 10, 11], [12, 13]]
    a = scan_batches(engine_batches(model, compile=True), prompts, ScanOptions(20, batch_size=2, eos_id=0, unk_id=1))
    assert batches and set(batches) == {2}  # every batch of the scan ran through the compiled programs
    b = scan_batches(engine_batches(model), prompts, ScanOptions(20, batch_size=2, eos_id=0, unk_id=1))
    assert [r.tokens for r in a.records] == [r.tokens for r in b.records]
    assert json_safe(a) == json_safe(b)
