"""Weight-only bfloat16 and int8 linear layers (genprobe.model.weight_only): the conversion and the int8
quantization, the loader and CLI option, and the compiled path reading the narrow weights (equal to the same
model run eagerly, edits seen, cache verified)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from genprobe._io import json_safe
from genprobe.engine.fast import compiled as compiled_mod
from genprobe.engine.fast import kernels
from genprobe.engine.generate import generate
from genprobe.model.errors import ModelLoadError
from genprobe.model.gpt import GPT
from genprobe.model.load import load_model
from genprobe.model.weight_only import WeightOnlyLinear, quantize_int8, weight_dtype_of, with_weight_dtype

NARROW = [torch.bfloat16, torch.int8]


@pytest.fixture(scope="module", params=NARROW, ids=["bfloat16", "int8"])
def bf16_model(request, sharp_gpt) -> GPT:
    """The sharp model with its linear layers stored narrow (each test runs once per narrow dtype)."""
    return with_weight_dtype(sharp_gpt(), request.param)


@pytest.fixture(scope="module")
def int8_model(sharp_gpt) -> GPT:
    """The sharp model, int8. The batched tests below build their programs for int8 alone: a batch of bfloat16 rows
    takes the same AOT programs and kernel calls with the other weight type, whose products at every row count are
    tested bit for bit in test_kernels.py (and which path a narrow batch takes, per dtype, in
    test_compiled_stepwise.py); a second dtype here would be three more builds (~35 s of a core)."""
    return with_weight_dtype(sharp_gpt(), torch.int8)


def test_conversion_rounds_the_linear_layers_only_and_leaves_the_original_alone(sharp_gpt):
    m = sharp_gpt()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    out = with_weight_dtype(m, torch.bfloat16)
    assert out is not m and isinstance(out, GPT)
    layers = [mod for mod in out.modules() if isinstance(mod, WeightOnlyLinear)]
    assert len(layers) == 4 * m.cfg.n_layer  # c_attn, c_proj, fc, proj per block
    assert all(lay.weight.dtype == torch.bfloat16 and lay.bias.dtype == torch.float32 for lay in layers)
    assert out.wte.weight.dtype == torch.float32 and out.lm_head.weight is out.wte.weight  # still tied, float32
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())  # the original is untouched
    assert out.h[0].attn.c_attn.weight.data_ptr() != m.h[0].attn.c_attn.weight.data_ptr()
    assert torch.equal(out.h[0].mlp.c_fc.weight.float(), m.h[0].mlp.c_fc.weight.to(torch.bfloat16).float())
    assert with_weight_dtype(m, torch.float32) is m


def test_a_layer_computes_float32_maths_on_the_rounded_weights():
    torch.manual_seed(0)
    lin = torch.nn.Linear(40, 24)
    layer = WeightOnlyLinear(lin, torch.bfloat16)
    x = torch.randn(5, 40)
    expected = F.linear(x, lin.weight.detach().to(torch.bfloat16).float(), lin.bias.detach())
    assert torch.equal(layer(x), expected)
    assert layer(x).dtype == torch.float32 and "weight_dtype=torch.bfloat16" in repr(layer)


def test_an_int8_layer_scales_the_integer_product_per_output():
    torch.manual_seed(0)
    lin = torch.nn.Linear(40, 24)
    layer = WeightOnlyLinear(lin, torch.int8)
    assert layer.weight.dtype == torch.int8 and layer.scale is not None and layer.scale.shape == (24,)
    x = torch.randn(5, 40)
    expected = F.linear(x, layer.weight.float()) * layer.scale + lin.bias.detach()
    assert torch.equal(layer(x), expected) and "weight_dtype=torch.int8" in repr(layer)
    # The product on the integers, scaled after, is the dequantized layer up to float32 rounding.
    close = F.linear(x.double(), layer.dequantized().double(), lin.bias.detach().double())
    assert float((layer(x).double() - close).abs().max()) < 1e-5


def test_int8_quantization_keeps_each_rows_extreme_and_rounds_the_rest_within_half_a_step():
    torch.manual_seed(1)
    w = torch.randn(16, 33) * torch.logspace(-3, 2, 16)[:, None]  # rows of very different magnitudes
    w[3] = 0.0  # an all-zero row: no scale from its maximum
    w[5, :4] = torch.tensor([2.54, -1.27, 0.005, 0.015])  # max 2.54: step 0.02, so 0.005 and 0.015 are ties
    w[5, 4:] = 0.0
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32 and int(q.min()) >= -127
    assert torch.equal(q[3], torch.zeros(33, dtype=torch.int8)) and float(scale[3]) == 1.0
    rows = [n for n in range(16) if n != 3]
    assert torch.equal(q[rows].abs().amax(dim=1), torch.full((15,), 127, dtype=torch.int8))  # each row's extreme
    err = (q.float() * scale[:, None] - w).abs()
    assert bool((err <= scale[:, None] / 2 * (1 + 1e-5)).all())
    assert q[5, :4].tolist() == [127, -64, 0, 1]  # -63.5 -> -64, 0.25 -> 0, 0.75 -> 1: round to nearest
    # Ties round half to even (torch.round), whatever the sign.
    q2, s2 = quantize_int8(torch.tensor([[127.0, 0.5, 1.5, -2.5, 2.5, -0.5]]))
    assert float(s2[0]) == 1.0 and q2[0].tolist() == [127, 0, 2, -2, 2, 0]


def test_int8_quantization_refuses_what_has_no_scale():
    with pytest.raises(ValueError, match="needs finite weights"):
        quantize_int8(torch.tensor([[1.0, float("inf")]]))
    with pytest.raises(ValueError, match="needs finite weights"):
        quantize_int8(torch.tensor([[float("nan"), 1.0]]))
    with pytest.raises(ValueError, match="2-D float weight"):
        quantize_int8(torch.ones(3))


def test_bad_weight_dtypes_name_the_choices(sharp_gpt):
    with pytest.raises(ValueError, match=r"weight dtype must be one of \['bfloat16', 'float32', 'int8'\], got 'int4'"):
        weight_dtype_of("int4")
    with pytest.raises(ValueError, match="supports bfloat16 and int8, got torch.float16"):
        with_weight_dtype(sharp_gpt(), torch.float16)
    with pytest.raises(ValueError, match="converts a float32 model"):
        with_weight_dtype(sharp_gpt().double(), torch.int8)


@pytest.mark.parametrize("dtype", NARROW, ids=["bfloat16", "int8"])
def test_the_output_layer_is_stored_narrow_only_when_asked(sharp_gpt, dtype):
    """``narrow_output``: the head tied to the embedding gets its own narrow copy, the lookup stays float32."""
    m = sharp_gpt()
    out = with_weight_dtype(m, dtype, narrow_output=True)
    assert isinstance(out.lm_head, WeightOnlyLinear) and out.lm_head.weight.dtype == dtype
    assert out.wte.weight.dtype == torch.float32 and torch.equal(out.wte.weight, m.wte.weight)
    x = torch.randn(3, m.cfg.d_model)
    assert torch.allclose(out.lm_head(x), F.linear(x, out.lm_head.dequantized()), atol=1e-4)
    ids = torch.tensor([[5, 9, 2, 41, 7]])
    with torch.no_grad():  # the rounded head moves the logits of the model whose head stayed float32
        assert float((out(ids) - with_weight_dtype(m, dtype)(ids)).abs().max()) > 1e-3
    with pytest.raises(ValueError, match="a narrow output layer needs a narrow weight dtype"):
        with_weight_dtype(m, torch.float32, narrow_output=True)


def test_compiled_generation_reads_the_narrow_weights_and_equals_eager(bf16_model, sharp_gpt):
    prompts = [[5, 9, 2, 41, 7]]
    a = generate(bf16_model, prompts, 20, compile=True, return_logits=True)
    b = generate(bf16_model, prompts, 20, return_logits=True)
    decoder = compiled_mod._aot_decoders.get(bf16_model, {}).get((1, bf16_model.cfg.block_size))
    assert decoder is not None  # the AOT path ran
    bound = decoder._weights()
    stored = bf16_model.h[0].attn.c_attn.weight.dtype
    assert stored in NARROW and bound["model.h.0.attn.c_attn.weight"].dtype == stored  # as stored: no float32 copy
    assert a.tokens == b.tokens
    assert max(float((x - y).abs().max()) for x, y in zip(a.step_logits, b.step_logits, strict=True)) < 1e-4
    # The rounding matters at this scale: the float32 model's logits are not these.
    f32 = generate(sharp_gpt(), prompts, 20, return_logits=True)
    assert max(float((x - y).abs().max()) for x, y in zip(a.step_logits, f32.step_logits, strict=True)) > 1e-3


@pytest.mark.skipif(
    kernels.build.unsupported_reason() is not None,
    reason=f"genprobe's kernels cannot run here: {kernels.build.unsupported_reason()}",
)
def test_a_large_narrow_model_decodes_its_batches_on_the_kernels(monkeypatch, int8_model, sharp_gpt):
    """A model counted as large (here by lowering the threshold) decodes batches stepwise when float32, but
    through the AOT programs when its weights are narrow (the stepwise path would widen them)."""
    monkeypatch.setattr(compiled_mod, "STEPWISE_MIN_WORK", 1)
    assert not compiled_mod.uses_aot(sharp_gpt(), 2) and compiled_mod.uses_aot(int8_model, 2)
    prompts = [[5, 9, 2, 41, 7], [3, 8, 1, 6, 4]]
    a = generate(int8_model, prompts, 12, compile=True, return_logits=True)
    b = generate(int8_model, prompts, 12, return_logits=True)
    assert (2, int8_model.cfg.block_size) in compiled_mod._aot_decoders.get(int8_model, {})
    assert a.tokens == b.tokens
    assert max(float((x - y).abs().max()) for x, y in zip(a.step_logits, b.step_logits, strict=True)) < 1e-4


def test_in_place_edits_of_narrow_weights_are_seen(bf16_model):
    prompts = [[2, 3, 4]]
    generate(bf16_model, prompts, 4, compile=True)
    layer = bf16_model.h[0].mlp.c_proj
    edits = [(layer.weight, -1)] + ([] if layer.scale is None else [(layer.scale, 2.0)])  # int8: its scale too
    originals = [w.detach().clone() for w, _ in edits]
    try:
        with torch.no_grad():
            for w, factor in edits:
                w.mul_(factor)
        a = generate(bf16_model, prompts, 12, compile=True, return_logits=True)
        b = generate(bf16_model, prompts, 12, return_logits=True)
        assert a.tokens == b.tokens
        assert max(float((x - y).abs().max()) for x, y in zip(a.step_logits, b.step_logits, strict=True)) < 1e-4
    finally:
        with torch.no_grad():
            for (w, _), original in zip(edits, originals, strict=True):
                w.copy_(original)


def test_the_cache_verifier_passes_on_the_narrow_compiled_path(int8_model):
    from genprobe.verify.adapters import CompiledEngineAdapter, FullRecompute
    from genprobe.verify.harness import VerifyOptions, verify_implementation

    report = verify_implementation(
        CompiledEngineAdapter(int8_model),
        FullRecompute(int8_model),
        [[4, 5, 6, 7], [8, 9]],
        VerifyOptions(max_new_tokens=12),
    )
    assert report.verdict == "pass", json_safe(report)


def _save(tmp_path, model: GPT):
    from genprobe.corpus.tokenizer import CharTokenizer
    from genprobe.model.checkpoint import save_checkpoint

    tok = CharTokenizer([chr(0x4E00 + i) for i in range(model.cfg.vocab_size - 2)])
    return save_checkpoint(tmp_path / "ckpt", model, tok, {})


def test_the_loader_converts_genprobe_checkpoints_and_refuses_transformers_models(tmp_path, sharp_gpt):
    path = _save(tmp_path, sharp_gpt())
    m = load_model(path, weight_dtype=torch.bfloat16)
    assert isinstance(m.module.h[1].mlp.c_fc, WeightOnlyLinear)
    assert load_model(path, weight_dtype=torch.int8).module.h[1].mlp.c_fc.weight.dtype == torch.int8
    assert isinstance(load_model(path).module.h[1].mlp.c_fc, torch.nn.Linear)
    from genprobe.model.hf_dir import export_hf_dir

    hf = tmp_path / "hf"
    export_hf_dir(sharp_gpt(), hf)
    with pytest.raises(ModelLoadError, match="weight-only torch.bfloat16 storage is for genprobe checkpoints"):
        load_model(hf, weight_dtype=torch.bfloat16)
    assert load_model(path, weight_dtype=torch.int8, narrow_output=True).module.lm_head.weight.dtype == torch.int8
    with pytest.raises(
        ModelLoadError,
        match=r"narrow_output .* must be bfloat16 or int8 \(and not the model's dtype\); got torch.float32",
    ):
        load_model(path, narrow_output=True)


# The eager cache's verdict for bfloat16, the compiled path's for int8 (its decode programs are the ones built above;
# the same for bfloat16 would be three more builds of the compiled path the tests above already verify).
@pytest.mark.parametrize(("dtype", "compiled"), [("bfloat16", False), ("int8", True)])
def test_verify_cache_gives_the_narrow_model_its_own_verdict(tmp_path, capsys, sharp_gpt, dtype, compiled):
    from genprobe.cli import main

    path = _save(tmp_path, sharp_gpt())
    args = ["verify-cache", str(path), "--weight-dtype", dtype, "--max-new-tokens", "8"]
    rc = main([*args, *(["--compiled"] if compiled else []), "--prompt", "一丁七万", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["weight_dtype"] == dtype
    names = ["engine", "engine-compiled"] if compiled else ["engine"]
    assert [(r["impl"], r["verdict"]) for r in out["implementations"]] == [(n, "pass") for n in names]


def test_generate_takes_the_weight_dtype(tmp_path, capsys, sharp_gpt):
    from genprobe.cli import main

    path = _save(tmp_path, sharp_gpt())
    args = ["generate", str(path), "--prompt", "一丁七万", "--greedy", "--ignore-eos", "--max-new-tokens", "16"]
    runs = {}
    for dtype in ("float32", "bfloat16", "int8"):
        assert main([*args, "--weight-dtype", dtype, "--json"]) == 0
        runs[dtype] = json.loads(capsys.readouterr().out)
        assert runs[dtype]["weight_dtype"] == dtype
    prompt = [runs["bfloat16"]["prompt_tokens"]]
    for dtype in ("float32", "bfloat16", "int8"):
        model = with_weight_dtype(sharp_gpt(), weight_dtype_of(dtype))
        assert runs[dtype]["tokens"] == generate(model, prompt, 16).tokens[0]
    for dtype in ("bfloat16", "int8"):
        assert runs[dtype]["steps"] != runs["float32"]["steps"]  # the rounding moves the step probabilities


def test_the_cli_narrows_the_output_layer_only_with_a_narrow_weight_dtype(tmp_path, capsys, sharp_gpt):
    from genprobe.cli import main

    path = _save(tmp_path, sharp_gpt())
    args = [
        "generate",
        str(path),
        "--prompt",
        "一丁七万",
        "--greedy",
        "--ignore-eos",
        "--max-new-tokens",
        "12",
        "--json",
    ]
    assert main([*args, "--weight-dtype", "int8", "--narrow-output"]) == 0
    run = json.loads(capsys.readouterr().out)
    assert run["weight_dtype"] == "int8" and run["narrow_output"] is True
    model = with_weight_dtype(sharp_gpt(), torch.int8, narrow_output=True)
    assert run["tokens"] == generate(model, [run["prompt_tokens"]], 12).tokens[0]
    assert main([*args, "--narrow-output"]) != 0
    assert "must be bfloat16 or int8 (and not the model's dtype); got torch.float32" in capsys.readouterr().err
