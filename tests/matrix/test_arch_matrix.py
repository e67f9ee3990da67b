"""Architecture × capability matrix on tiny random configs (one test per cell).

Run ``GENPROBE_MATRIX_OUT=matrix.md pytest tests/matrix`` to write the table docs/arch-matrix.md shows.
"""

from __future__ import annotations

import pytest
import torch

from genprobe._io import json_safe
from genprobe.engine.generate import generate
from genprobe.engine.loaded import load_model

from .conftest import ARCHS, SLIDING_WINDOW

PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16], [20, 21, 22]]  # left-padded batch; > the sliding window
NEW = 20


def _hf_greedy(module, prompts: list[list[int]], new: int) -> list[list[int]]:
    """transformers' own generate(): greedy, left padding, no early stop."""
    P = max(map(len, prompts))
    ids = torch.zeros(len(prompts), P, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, P - len(p) :] = torch.tensor(p)
        mask[i, P - len(p) :] = 1
    out = module.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=new,
        min_new_tokens=new,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[:, P:].tolist()


@pytest.mark.parametrize("arch", ARCHS)
def test_generate(arch, tiny_hf_dirs):
    """Our engine's HF path gives transformers.generate's greedy tokens, batched and alone, and its logits."""
    model = load_model(tiny_hf_dirs[arch])
    ours = generate(model.runner, PROMPTS, NEW, return_logits=True)
    assert ours.tokens == _hf_greedy(model.module, PROMPTS, NEW)
    for row, p in enumerate(PROMPTS):
        assert ours.tokens[row] == _hf_greedy(model.module, [p], NEW)[0]
    assert len({t for row in ours.tokens for t in row}) > 3  # the continuation is not one repeated token
    # Every cached step's logits equal a full recomputation of the sequence so far (last real position).
    full = model.runner.full(
        torch.tensor([PROMPTS[0] + ours.tokens[0]]), torch.ones(1, len(PROMPTS[0]) + NEW, dtype=torch.bool)
    )
    P = len(PROMPTS[0])
    for i, step in enumerate(ours.step_logits):
        assert torch.allclose(step[0], full[0, P - 1 + i], atol=1e-4), f"step {i}"


@pytest.mark.parametrize("arch", ARCHS)
def test_verify_cache(arch, tiny_hf_dirs):
    """verify-cache on the model's own transformers cache: every phase (prefill, greedy decode, chunked prefill,
    left-padded batch, isolation) equals full recomputation — for the sliding-window archs past the window."""
    import genprobe

    model = genprobe.load(tiny_hf_dirs[arch])
    report = genprobe.verify_cache(model, prompts=PROMPTS, max_new_tokens=NEW)
    assert report.verdict == "pass", json_safe(report)


@pytest.mark.parametrize("arch", ARCHS)
def test_attention_capture(arch, tiny_hf_dirs):
    """Per-head attention of a sequence longer than the sliding window: one probability row per query, nothing on
    future keys, nothing outside the window on sliding layers, and a report with one entry per head."""
    import genprobe

    model = genprobe.load(tiny_hf_dirs[arch])
    ids = list(range(3, 3 + 16))
    report = genprobe.attention_heads(model, ids, distance=4)
    assert (report.n_layer, report.n_head) == (2, 4) and len(report.heads) == 8
    from genprobe.attention.capture import capture_attention

    probs = capture_attention(model.module, ids).probs  # (L, H, T, T)
    T = len(ids)
    assert probs.shape == (2, 4, T, T)
    assert torch.allclose(probs.sum(-1), torch.ones(2, 4, T), atol=1e-5)
    assert probs.triu(1).abs().max() == 0
    cfg = model.module.config
    layer_types = getattr(cfg, "layer_types", None) or ["full_attention"] * 2
    if arch == "mistral":
        layer_types = ["sliding_attention"] * 2
    outside = torch.ones(T, T, dtype=torch.bool).tril(-SLIDING_WINDOW)  # keys at distance >= window
    for layer, kind in enumerate(layer_types[:2]):
        if kind == "sliding_attention":
            assert probs[layer][:, outside].abs().max() == 0, f"layer {layer} attends outside its window"
        else:
            assert probs[layer][:, outside].abs().max() > 0  # a full layer does see the far keys


@pytest.mark.parametrize("arch", ARCHS)
def test_mlp_sites_and_patch(arch, tiny_hf_dirs):
    """The MLP down-projection of every layer is found; an edit applied in memory changes the output and its revert
    restores the weights bit for bit (sha256)."""
    from genprobe.loops.patch import EditSpec, apply_patch, finalise, make_patch, revert_patch

    model = load_model(tiny_hf_dirs[arch])
    sites = model.mlp_sites()
    assert len(sites) == 2 and all(s.d_ff > 0 and s.d_model == 32 for s in sites)
    torch.manual_seed(1)
    dirs = {layer: torch.randn(s.d_model) for layer, s in enumerate(sites)}
    units = {layer: torch.rand(s.d_ff) for layer, s in enumerate(sites)}
    before = model.state_sha256()
    x = torch.tensor([PROMPTS[0]])
    logits0 = model.module(x).logits
    patch = finalise(model.module, make_patch(model.module, EditSpec((0, 1), 8, "subtract", 2.0), dirs, units))
    apply_patch(model.module, patch)
    assert model.state_sha256() == patch.meta["sha256_after"] != before
    assert not torch.allclose(model.module(x).logits, logits0)
    revert_patch(model.module, patch)
    assert model.state_sha256() == before
    assert torch.equal(model.module(x).logits, logits0)


def test_unsupported_architecture_is_refused(tmp_path):
    """A config whose model_type transformers does not know is refused, naming the type and the supported ones."""
    import json

    from safetensors.torch import save_file

    from genprobe.model.errors import ModelLoadError

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "not_a_real_arch", "vocab_size": 8}))
    save_file({"w": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="not_a_real_arch"):
        load_model(tmp_path)
