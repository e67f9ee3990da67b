"""Hooks capture the right tensors and never leak; edit formulas; apply/revert exact; wrong model refused."""

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from genprobe.loops.contrast import ablate, capture
from genprobe.loops.patch import (
    EditSpec,
    PatchError,
    apply_patch,
    edit_columns,
    finalise,
    load_patch,
    make_patch,
    revert_patch,
    save_patch,
    select_columns,
)
from genprobe.loops.regress import forward_logits
from genprobe.metrics.degeneracy import measure_loops
from genprobe.model.arch import all_columns, get_columns, mlp_sites, state_sha256


@pytest.fixture(autouse=True)
def _single_thread():
    """Tiny models decode faster on one thread, and far faster on a shared, loaded machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    return LlamaForCausalLM(cfg).eval()


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=50, n_positions=32, n_embd=32, n_layer=2, n_head=2, bos_token_id=None, eos_token_id=None
    )
    return GPT2LMHeadModel(cfg).eval()


@pytest.fixture(params=["gpt", "gpt2", "llama"])
def any_model(request, tiny_model):
    return {"gpt": lambda: tiny_model, "gpt2": _gpt2, "llama": _llama}[request.param]()


def _n_hooks(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def _manual_mlp(site, x_ln):
    """Recompute MLP output and unit activations by hand from the MLP input."""
    mlp = site.mlp
    if hasattr(mlp, "down_proj"):  # Llama: down(act(gate) * up)
        units = F.silu(mlp.gate_proj(x_ln)) * mlp.up_proj(x_ln)
    elif hasattr(mlp, "c_fc"):
        units = F.gelu(mlp.c_fc(x_ln), approximate="tanh")
    W = all_columns(site)  # (d_ff, d_model)
    out = units @ W + site.down.bias if getattr(site.down, "bias", None) is not None else units @ W
    return units, out


def test_capture_matches_manual_computation_and_leaves_no_hook(any_model):
    ids = torch.randint(0, 50, (2, 7))
    sites = mlp_sites(any_model)
    assert [s.layer for s in sites] == [0, 1]
    mlp_in = {}
    pre = [
        s.mlp.register_forward_pre_hook(lambda m, i, layer=s.layer: mlp_in.__setitem__(layer, i[0].detach()))
        for s in sites
    ]
    try:
        with torch.no_grad(), capture(any_model) as cap:
            logits = forward_logits(any_model, ids)
    finally:
        for h in pre:
            h.remove()
    assert _n_hooks(any_model) == 0
    for s in sites:
        units, out = _manual_mlp(s, mlp_in[s.layer])
        torch.testing.assert_close(cap["units"][s.layer][0], units, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(cap["mlp_out"][s.layer][0], out, atol=1e-5, rtol=1e-5)
        assert cap["resid"][s.layer][0].shape == (2, 7, s.d_model)
    # the last block's residual, through the final norm and head, gives the logits
    m = any_model
    last = cap["resid"][1][0]
    norm = m.ln_f if hasattr(m, "ln_f") else (m.transformer.ln_f if hasattr(m, "transformer") else m.model.norm)
    head = m.lm_head
    torch.testing.assert_close(head(norm(last)), logits, atol=1e-4, rtol=1e-4)


def test_hooks_removed_on_exception(any_model):
    ids = torch.randint(0, 50, (1, 5))
    d = {0: torch.randn(32), 1: torch.randn(32)}
    with pytest.raises(RuntimeError, match="boom"):
        with capture(any_model):
            assert _n_hooks(any_model) == 6
            raise RuntimeError("boom")
    assert _n_hooks(any_model) == 0
    with pytest.raises(RuntimeError, match="boom"):
        with ablate(any_model, d):
            assert _n_hooks(any_model) == 2
            forward_logits(any_model, ids)
            raise RuntimeError("boom")
    assert _n_hooks(any_model) == 0


def test_ablation_removes_the_component(any_model):
    ids = torch.randint(0, 50, (2, 6))
    d = torch.randn(32)
    d = d / d.norm()
    with torch.no_grad(), ablate(any_model, {1: d}), capture(any_model) as cap:
        forward_logits(any_model, ids)
    # hooks fire in registration order: ablation first, so the capture sees the ablated output
    assert float((cap["mlp_out"][1][0] @ d).abs().max()) < 1e-5
    with torch.no_grad(), capture(any_model) as cap:
        forward_logits(any_model, ids)
    assert float((cap["mlp_out"][1][0] @ d).abs().max()) > 1e-3


def test_edit_formulas_on_small_matrix():
    W = torch.tensor([[1.0, 2.0, 0.0], [0.0, 1.0, 3.0]])  # (d_model=2, d_ff=3); columns are units
    d = torch.tensor([3.0, 4.0])  # not normalised on purpose: edit_columns normalises
    u = d / 5
    cols = W.T[[0, 2]]  # columns 0 and 2 as rows
    sub = edit_columns(cols, d, 0.5, "subtract")
    torch.testing.assert_close(sub, torch.stack([W[:, 0] - 0.5 * u, W[:, 2] - 0.5 * u]))
    proj = edit_columns(cols, d, 1.0, "project")
    torch.testing.assert_close(proj @ u, torch.zeros(2), atol=1e-6, rtol=0)  # component along d removed
    torch.testing.assert_close(proj[0], W[:, 0] - (W[:, 0] @ u) * u)
    half = edit_columns(cols, d, 0.5, "project")
    torch.testing.assert_close(half @ u, 0.5 * (cols @ u))
    with pytest.raises(ValueError, match="edit form"):
        edit_columns(cols, d, 1.0, "multiply")


def test_select_columns_top_k():
    s = torch.tensor([0.1, 5.0, -3.0, 2.0, 4.0])
    assert select_columns(s, 2).tolist() == [1, 4]
    with pytest.raises(ValueError, match="k must be"):
        select_columns(s, 6)


def _patch_for(model, form="subtract", k=4, layers=(0, 1)):
    sites = mlp_sites(model)
    torch.manual_seed(1)
    dirs = {layer: torch.randn(sites[layer].d_model) for layer in layers}
    units = {layer: torch.rand(sites[layer].d_ff) for layer in layers}
    return finalise(model, make_patch(model, EditSpec(tuple(layers), k, form, 0.3), dirs, units))


@pytest.mark.parametrize("form", ["subtract", "project"])
def test_apply_revert_exact(any_model, form, tmp_path):
    before = state_sha256(any_model)
    patch = _patch_for(any_model, form)
    assert state_sha256(any_model) == before  # finalise leaves the model untouched
    save_patch(patch, tmp_path / "p")
    loaded = load_patch(tmp_path / "p.json")
    after = apply_patch(any_model, loaded)
    assert after == patch.meta["sha256_after"] != before
    # exactly the selected columns changed, nothing else
    for t in loaded.targets:
        site = mlp_sites(any_model)[t.layer]
        torch.testing.assert_close(get_columns(site, t.columns), t.new, atol=0, rtol=0)
    assert 0 < loaded.meta["fraction_changed"] < 0.05
    assert loaded.meta["weights_changed"] == 2 * 4 * 32
    with pytest.raises(PatchError, match="refusing to apply"):
        apply_patch(any_model, loaded)  # already applied: the hash is the "after" one
    assert revert_patch(any_model, loaded) == before
    assert state_sha256(any_model) == before
    with pytest.raises(PatchError, match="refusing to revert"):
        revert_patch(any_model, loaded)


def test_patch_refused_on_other_model(tiny_cfg):
    from genprobe.model.gpt import GPT

    torch.manual_seed(0)
    a = GPT(tiny_cfg).eval()
    torch.manual_seed(1)
    b = GPT(tiny_cfg).eval()
    patch = _patch_for(a)
    hb = state_sha256(b)
    with pytest.raises(PatchError) as exc:
        apply_patch(b, patch)
    assert hb in str(exc.value) and patch.meta["sha256_before"] in str(exc.value)
    assert state_sha256(b) == hb
    # a one-ulp difference anywhere is enough to refuse
    with torch.no_grad():
        a.ln_f.bias[0] = torch.nextafter(a.ln_f.bias[0], torch.tensor(1.0))
    with pytest.raises(PatchError, match="refusing to apply"):
        apply_patch(a, patch)


def test_patch_file_tamper_detected(tiny_model, tmp_path):
    patch = _patch_for(tiny_model)
    st, js = save_patch(patch, tmp_path / "p")
    data = bytearray(st.read_bytes())
    data[-1] ^= 1
    st.write_bytes(bytes(data))
    with pytest.raises(PatchError, match="sha256"):
        load_patch(js)


@pytest.mark.parametrize("make", [_gpt2, _llama])
def test_scan_and_contrast_through_hf_adapter(make):
    """The observatory runs on transformers models via the engine's HFCausalLM runner."""
    from genprobe.engine.hf_adapter import HFCausalLM
    from genprobe.loops.contrast import collect_contrast, loop_direction
    from genprobe.loops.regress import RegressionProbe
    from genprobe.loops.scan import ScanOptions, engine_batches, scan_batches

    runner = HFCausalLM(make())
    torch.manual_seed(0)
    prompts = [torch.randint(2, 50, (4,)).tolist() for _ in range(6)]
    res = scan_batches(engine_batches(runner), prompts, ScanOptions(24, batch_size=3, unk_id=1))
    assert res.summary.n == 6
    # force a labelled loop so the contrast has both classes whatever the random model did
    recs = [replace(r, measures=measure_loops(list(range(1000, 1024)))) for r in res.records]
    recs[0] = replace(recs[0], measures=measure_loops([7, 8] * 12))
    con = collect_contrast(runner, recs, batch_size=4)
    # record 0: prompt 4 + 24 generated; positions t = 5..26 predict generated indices >= onset + period = 2
    assert con.loop[0].shape == (22, 32)
    assert con.reference[0].shape == (5 * 24, 32)  # every generated-token prediction of the other 5 rows
    d = loop_direction(con.loop[1], con.reference[1])
    assert abs(float(d.norm()) - 1) < 1e-5
    probe = RegressionProbe(runner, [list(range(2, 18))] * 3)
    m = probe.measure(runner)
    assert abs(m.kl) < 1e-6 and abs(m.dloss) < 1e-6
