"""Regenerate the contrastive-search reference: run with transformers 4.x, where it was still in core.

transformers 5 moved contrastive search out of ``generate`` (to the Hub repository
``transformers-community/contrastive-search``, unreachable offline), so these vectors come from
transformers 4.52.4, ``GenerationMixin._contrastive_search`` / ``_ranking_fast``, in a throwaway
virtual environment (torch 2.13 CPU)::

    python -m venv /tmp/venv-tf4 && /tmp/venv-tf4/bin/pip install "transformers==4.52.4" torch safetensors
    /tmp/venv-tf4/bin/python tests/engine/data/contrastive/make_reference.py

It builds two tiny random models from fixed seeds (GPT-2 and Llama layouts), saves them as
safetensors next to this file, and records the tokens of ``generate(penalty_alpha=…, top_k=…)`` plus
the smallest margin between the best and second-best contrastive score over all steps (cases
whose margin is below 1e-4 would be decided by float rounding and are refused).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers
from transformers import GenerationConfig, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
from transformers.generation import utils as gen_utils

HERE = Path(__file__).resolve().parent
MIN_MARGIN = 1e-4
margins: list[float] = []
_ranking = gen_utils._ranking_fast


def _recording_ranking(context_hidden, next_hidden, next_top_k_probs, cosine_matrix_mask, alpha, beam_width):
    """HF's own ranking, plus the best-minus-second score margin of every row."""
    norm_context = context_hidden / context_hidden.norm(dim=2, keepdim=True)
    norm_next = next_hidden / next_hidden.norm(dim=2, keepdim=True)
    cosine = torch.matmul(norm_context, norm_next.transpose(1, 2)).squeeze(-1)
    cosine = cosine + (1 - cosine_matrix_mask.to(cosine.dtype)) * torch.finfo(cosine.dtype).min
    score = (1.0 - alpha) * next_top_k_probs.view(-1) - alpha * cosine.max(dim=-1).values
    top2 = torch.stack(torch.split(score, beam_width)).topk(2, dim=-1).values
    margins.extend((top2[:, 0] - top2[:, 1]).tolist())
    return _ranking(context_hidden, next_hidden, next_top_k_probs, cosine_matrix_mask, alpha, beam_width)


gen_utils._ranking_fast = _recording_ranking


def _scaled(model: torch.nn.Module, std: float) -> torch.nn.Module:
    """Larger random weights than the default init, so next-token distributions are not flat."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, std)
    return model.eval()


def build_models() -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=50,
            n_positions=64,
            n_embd=32,
            n_layer=2,
            n_head=2,
            n_inner=64,
            activation_function="gelu_new",
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            layer_norm_epsilon=1e-5,
            tie_word_embeddings=True,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=0,
            attn_implementation="eager",
        )
    )
    torch.manual_seed(1)
    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=0,
            attn_implementation="eager",
        )
    )
    return {"gpt2-tiny": _scaled(gpt2, 0.25), "llama-tiny": _scaled(llama, 0.25)}


CASES = [
    {"model": "gpt2-tiny", "prompts": [[3, 4, 5, 6]], "penalty_alpha": 0.6, "top_k": 4, "max_new_tokens": 24},
    {
        "model": "gpt2-tiny",
        "prompts": [[7, 8, 9, 10, 11], [12, 13]],
        "penalty_alpha": 0.5,
        "top_k": 3,
        "max_new_tokens": 20,
    },
    {
        "model": "gpt2-tiny",
        "prompts": [[20, 21, 22]],
        "penalty_alpha": 0.6,
        "top_k": 5,
        "max_new_tokens": 20,
        "repetition_penalty": 1.3,
    },
    {"model": "llama-tiny", "prompts": [[5, 9, 14, 2]], "penalty_alpha": 0.6, "top_k": 4, "max_new_tokens": 24},
    {
        "model": "llama-tiny",
        "prompts": [[30, 31, 32, 33, 34, 35], [40, 41, 42]],
        "penalty_alpha": 0.4,
        "top_k": 6,
        "max_new_tokens": 20,
    },
]


def run_case(model: torch.nn.Module, case: dict) -> list[list[int]]:
    P = max(len(p) for p in case["prompts"])
    ids = torch.zeros(len(case["prompts"]), P, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, p in enumerate(case["prompts"]):
        ids[b, P - len(p) :] = torch.tensor(p)
        mask[b, P - len(p) :] = 1
    gc = GenerationConfig(
        do_sample=False,
        penalty_alpha=case["penalty_alpha"],
        top_k=case["top_k"],
        max_new_tokens=case["max_new_tokens"],
        min_new_tokens=case["max_new_tokens"],
        repetition_penalty=case.get("repetition_penalty", 1.0),
        pad_token_id=0,
    )
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, generation_config=gc)
    return out[:, P:].tolist()


def main() -> None:
    models = build_models()
    for name, m in models.items():
        m.save_pretrained(HERE / name, safe_serialization=True)
    results = []
    for case in CASES:
        margins.clear()
        tokens = run_case(models[case["model"]], case)
        if min(margins) < MIN_MARGIN:
            raise SystemExit(f"case {case} is decided by a margin of {min(margins):.2e}: pick another")
        results.append({**case, "tokens": tokens, "min_margin": min(margins)})
    ref = {
        "reference": f"transformers {transformers.__version__} GenerationMixin._contrastive_search "
        f"(torch {torch.__version__})",
        "cases": results,
    }
    lines = ",\n".join("  " + json.dumps(c) for c in results)
    text = f'{{"reference": {json.dumps(ref["reference"])},\n "cases": [\n{lines}\n ]}}\n'
    (HERE / "expected.json").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
