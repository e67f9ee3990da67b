"""Architecture matrix for the loop pipeline on tiny random transformers models saved with safetensors:
MLP down-projection sites found, a patch applies to the model directory and reverts it bit for bit
(state sha256 and weight-file sha256), and a scan runs through our engine's HF path."""

import json

import pytest
import torch

from genprobe._io import sha256_file
from genprobe.engine.loaded import load_model
from genprobe.loops.patch import NOTE_FILE, EditSpec, PatchError, finalise, make_patch, patch_dir
from genprobe.loops.scan import ScanOptions, engine_batches, scan_batches
from genprobe.model.arch import mlp_sites, state_sha256
from genprobe.model.errors import UnsupportedArchitectureError

COMMON = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=128,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)


def _config(arch: str):
    import transformers as T

    gqa = dict(COMMON, num_key_value_heads=2)
    return {
        "gpt2": lambda: T.GPT2Config(
            vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=128, bos_token_id=None, eos_token_id=None
        ),
        "llama": lambda: T.LlamaConfig(**gqa),
        "qwen2": lambda: T.Qwen2Config(**gqa),
        "mistral": lambda: T.MistralConfig(sliding_window=8, **gqa),  # window shorter than the 24-token scan
        "gemma2": lambda: T.Gemma2Config(head_dim=8, sliding_window=8, **gqa),
        "gemma3": lambda: T.Gemma3TextConfig(head_dim=8, sliding_window=8, **gqa),
        "phi3": lambda: T.Phi3Config(**gqa),  # fused gate_up_proj
        "gpt_neox": lambda: T.GPTNeoXConfig(**COMMON),
    }[arch]()


EXPECTED = {  # first layer's down-projection weight name and storage layout
    "gpt2": ("transformer.h.0.mlp.c_proj.weight", "conv1d"),
    "llama": ("model.layers.0.mlp.down_proj.weight", "linear"),
    "qwen2": ("model.layers.0.mlp.down_proj.weight", "linear"),
    "mistral": ("model.layers.0.mlp.down_proj.weight", "linear"),
    "gemma2": ("model.layers.0.mlp.down_proj.weight", "linear"),
    "gemma3": ("model.layers.0.mlp.down_proj.weight", "linear"),
    "phi3": ("model.layers.0.mlp.down_proj.weight", "linear"),
    "gpt_neox": ("gpt_neox.layers.0.mlp.dense_4h_to_h.weight", "linear"),
}


@pytest.fixture(autouse=True)
def _single_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _save(arch: str, d):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(_config(arch)).save_pretrained(d, safe_serialization=True)
    return d


def _patch(module):
    sites = mlp_sites(module)
    torch.manual_seed(1)
    dirs = {layer: torch.randn(s.d_model) for layer, s in enumerate(sites)}
    units = {layer: torch.rand(s.d_ff) for layer, s in enumerate(sites)}
    return finalise(module, make_patch(module, EditSpec((0, 1), 4, "project", 1.0), dirs, units))


@pytest.mark.parametrize("arch", sorted(EXPECTED))
def test_sites_patch_dir_roundtrip_and_scan(arch, tmp_path):
    src = _save(arch, tmp_path / "src")
    model = load_model(src)
    sites = mlp_sites(model.module)
    name, layout = EXPECTED[arch]
    assert len(sites) == 2 and sites[0].weight_name == name and sites[0].layout == layout
    assert name in model.module.state_dict()
    assert model.mlp_sites()[1].weight_name == name.replace(".0.", ".1.")

    patch = _patch(model.module)
    before = state_sha256(model.module)
    assert patch.meta["sha256_before"] == before
    applied = patch_dir(src, patch, tmp_path / "patched")
    patched = load_model(tmp_path / "patched")  # from_pretrained loads the written copy
    assert patched.state_sha256() == patch.meta["sha256_after"] == applied.state_sha256 != before
    assert (tmp_path / "patched" / "config.json").read_bytes() == (src / "config.json").read_bytes()
    note = json.loads((tmp_path / "patched" / NOTE_FILE).read_text(encoding="utf-8"))
    assert note["original_weight_files"]["model.safetensors"] == sha256_file(src / "model.safetensors")

    reverted = patch_dir(tmp_path / "patched", patch, tmp_path / "back", revert=True)
    assert reverted.matches_original is True
    assert load_model(tmp_path / "back").state_sha256() == before
    assert sha256_file(tmp_path / "back" / "model.safetensors") == sha256_file(src / "model.safetensors")
    assert not (tmp_path / "back" / NOTE_FILE).exists()

    res = scan_batches(engine_batches(model.runner), [[3, 4, 5], [6, 7]], ScanOptions(24, batch_size=2, unk_id=None))
    assert res.summary.n == 2 and all(len(r.tokens) == 24 for r in res.records)


def test_patch_dir_refusals(tmp_path):
    src = _save("qwen2", tmp_path / "src")
    model = load_model(src)
    patch = _patch(model.module)
    with pytest.raises(PatchError, match="refusing to revert"):
        patch_dir(src, patch, tmp_path / "x", revert=True)  # the source is not patched
    patch_dir(src, patch, tmp_path / "p")
    with pytest.raises(PatchError, match="refusing to apply"):
        patch_dir(tmp_path / "p", patch, tmp_path / "y")  # already patched
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "other.txt").write_text("keep me", encoding="utf-8")
    with pytest.raises(PatchError, match="not an empty directory"):
        patch_dir(src, patch, tmp_path / "full")
    # in place: apply then revert restores the very file
    orig = sha256_file(src / "model.safetensors")
    patch_dir(src, patch, src)
    assert sha256_file(src / "model.safetensors") != orig and (src / NOTE_FILE).exists()
    r = patch_dir(src, patch, src, revert=True)
    assert r.matches_original and sha256_file(src / "model.safetensors") == orig and not (src / NOTE_FILE).exists()


def test_patch_dir_refuses_a_lossy_dtype(tmp_path):
    """A patch made in float32 cannot be written into bfloat16 weights exactly: refused, naming both dtypes."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(_config("llama")).to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    model = load_model(tmp_path / "bf16")  # loaded as float32
    with pytest.raises(PatchError, match="bfloat16.*float32"):
        patch_dir(tmp_path / "bf16", _patch(model.module), tmp_path / "out")


def test_unsupported_architectures_are_named():
    import transformers as T

    torch.manual_seed(0)
    moe = T.AutoModelForCausalLM.from_config(
        T.MixtralConfig(num_key_value_heads=2, num_local_experts=2, num_experts_per_tok=1, **COMMON)
    )
    with pytest.raises(UnsupportedArchitectureError, match="MixtralForCausalLM layer 0.*no down-projection.*mixture"):
        mlp_sites(moe)

    class NoLayers(torch.nn.Module):
        def forward(self, x):
            return x

    with pytest.raises(UnsupportedArchitectureError, match="NoLayers: no decoder layer list.*model.layers"):
        mlp_sites(NoLayers())
