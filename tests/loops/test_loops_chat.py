"""Loop scans and repair through the chat template (--chat), and the user's own held-out prompts."""

from __future__ import annotations

import json

import pytest
import torch

import genprobe.loops.study as study_module
from genprobe.cli import main
from genprobe.loops.patch import EditSpec, finalise, make_patch
from genprobe.loops.repair import transfer_stage
from genprobe.loops.study import LoopStudy, RepairConfig, RepairInputs
from genprobe.model.arch import state_sha256
from genprobe.model.load import load_model

from .conftest import POEM, save_tiny_qwen2

TEMPLATE = (
    "{% for m in messages %}<user>{{ m['content'] }}</user>{% endfor %}{% if add_generation_prompt %}<bot>{% endif %}"
)


@pytest.fixture
def chat_dir(tmp_path):
    d = save_tiny_qwen2(tmp_path / "qwen")
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps(cfg | {"chat_template": TEMPLATE}))
    return d


def test_scan_renders_each_prompt_through_the_chat_template(chat_dir, tmp_path, capsys):
    argv = ["loops", "scan", str(chat_dir), "--prompt", "床前明月", "--max-new-tokens", "16", "--no-calibrate"]
    assert main([*argv, "--chat", "--setting", "greedy", "--out", str(tmp_path / "o")]) == 0
    scan = json.loads((tmp_path / "o" / "scan.json").read_text())
    rec = scan["scans"]["greedy"]["records"][0]
    assert rec["prompt"] == "<user>床前明月</user><bot>" and scan["prompt_source"].endswith("(chat template)")
    plain = save_tiny_qwen2(tmp_path / "plain")  # no chat template: --chat is refused with the reason
    capsys.readouterr()
    assert main(["loops", "scan", str(plain), "--prompt", "床前", "--chat", "--no-calibrate"]) == 2
    assert "has no chat template" in capsys.readouterr().err


def test_the_transfer_check_measures_the_edit_in_the_other_setting_and_restores_the_model(chat_dir, monkeypatch):
    model = load_model(chat_dir)
    study = LoopStudy(model, RepairConfig(max_new_tokens=16, transfer=3, batch_size=4))
    rendered = []
    real = study_module.encode_prompts  # what the model is given to encode: rendered by the template or not
    monkeypatch.setattr(study_module, "encode_prompts", lambda m, texts: rendered.extend(texts) or real(m, texts))
    torch.manual_seed(0)
    d = {layer: torch.randn(32) for layer in range(2)}
    units = {layer: torch.rand(64) + 0.1 for layer in range(2)}
    patch = finalise(
        model.module, make_patch(model.module, EditSpec((0,), 4, "subtract", 1.0), d, units, {0: 1.0, 1: 1.0})
    )
    before = state_sha256(model.module)
    texts = [POEM[i : i + 4] for i in range(0, 20, 4)]
    t = transfer_stage(study, patch, texts, searched_chat=False)
    assert state_sha256(model.module) == before
    assert (t.setting, t.searched_in) == ("chat", "plain") and t.before.n == t.after.n == 3  # cfg.transfer prompts
    assert rendered == [f"<user>{x}</user><bot>" for x in texts[:3]]
    rendered.clear()
    back = transfer_stage(study, patch, texts, searched_chat=True)
    assert (back.setting, back.searched_in) == ("plain", "chat") and rendered == texts[:3]


def test_the_users_own_held_out_prompts_stay_out_of_the_search():
    cfg = RepairConfig(n_direction=4, n_search=4, n_validate=3)
    prompts = [POEM[i : i + 3] for i in range(0, 30, 3)]
    held = ["白日依山", "黃河入海", "欲窮千里", "更上一層"]
    inputs = RepairInputs.from_prompts(prompts, POEM, cfg, validate=held)
    assert inputs.validate == held[:3]  # the first n_validate, in the user's order
    assert not set(inputs.direction + inputs.search) & set(held)
    assert len(inputs.direction) == len(inputs.search) == 4
    with pytest.raises(ValueError, match="also search/direction prompts"):
        RepairInputs.from_prompts(prompts, POEM, cfg, validate=[prompts[0]])
