"""Architecture × capability matrix on tiny random configs (one test per cell).

Run ``GENPROBE_MATRIX_OUT=matrix.md pytest tests/matrix`` to write the table the README shows.
"""

from __future__ import annotations

import pytest
import torch

from genprobe.engine.generate import generate
from genprobe.model.load import load_model

from .conftest import ARCHS

PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16], [20, 21, 22]]  # left-padded batch; > the sliding window
NEW = 20


def _hf_greedy(module, prompts: list[list[int]], new: int) -> list[list[int]]:
    """transformers' own generate(): greedy, left padding, no early stop."""
    P = max(map(len, prompts))
    ids = torch.zeros(len(prompts), P, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, P - len(p):] = torch.tensor(p)
        mask[i, P - len(p):] = 1
    out = module.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                          eos_token_id=None, pad_token_id=0)
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
    full = model.runner.full(torch.tensor([PROMPTS[0] + ours.tokens[0]]), torch.ones(1, len(PROMPTS[0]) + NEW, dtype=torch.bool))
    P = len(PROMPTS[0])
    for i, step in enumerate(ours.step_logits):
        assert torch.allclose(step[0], full[0, P - 1 + i], atol=1e-4), f"step {i}"
