"""Seed §3.5: how temperature, top-k/top-p and their order reshape ONE real next-token distribution.

Everything here is computed on the distribution after the case prompt, so the numbers are
directly comparable with the seed's tables (entropy vs τ, nucleus curve, order trap) and the
exported distribution drives the report's sampling lab.
"""

from __future__ import annotations

import math

import torch

from ..corpus import CharTokenizer
from ..engine.sampling import SamplerConfig, kept_set_size
from ..model.gpt import GPT
from ._common import CASE_PROMPT, encode_prompt, entropy_nats, next_token_logits, r

TEMPERATURES = (0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 3.0)
NUCLEUS_PS = (0.5, 0.8, 0.9, 0.95, 0.99, 0.999)
ORDER_TAUS = (0.5, 1.0, 1.5, 2.0)
ORDERS = ("trunc_then_temp", "temp_then_trunc", "hf", "vllm", "llama.cpp")


def entropy_table(logits: torch.Tensor, temperatures=TEMPERATURES) -> list[dict]:
    """Entropy (nats), perplexity and max probability of softmax(logits/τ) for each τ (seed §3.5.2)."""
    rows = []
    for tau in temperatures:
        h, pmax = entropy_nats(logits, tau)
        rows.append({"tau": tau, "entropy": r(h), "perplexity": r(math.exp(h), 2), "max_prob": r(pmax)})
    return rows


def nucleus_curve(logits: torch.Tensor, ps=NUCLEUS_PS) -> list[dict]:
    """Tokens kept by top-p at τ = 1 for each p (seed §3.5.4)."""
    V = logits.numel()
    out = []
    for p in ps:
        k = kept_set_size(logits, SamplerConfig(top_p=p))
        out.append({"p": p, "kept": k, "share_of_vocab": r(k / V)})
    return out


def order_trap(logits: torch.Tensor, top_p: float = 0.9, taus=ORDER_TAUS, orders=ORDERS) -> list[dict]:
    """Kept-set size at top-p ``top_p`` under each sampler order / engine preset for each τ (seed §3.5.5)."""
    rows = []
    for tau in taus:
        row: dict = {"tau": tau}
        for order in orders:
            row[order] = kept_set_size(logits, SamplerConfig(temperature=tau, top_p=top_p, order=order))
        rows.append(row)
    return rows


def run_sampling(model: GPT, tok: CharTokenizer, prompt: str = CASE_PROMPT) -> dict:
    """The ``sampling`` key of ``ch3_case.json``: tables plus the full distribution for the sampling lab."""
    ids, unknown = encode_prompt(tok, prompt)
    logits = next_token_logits(model, ids)
    probs = torch.softmax(logits.double(), -1)
    top = torch.argsort(probs, descending=True)[:10]
    return {
        "prompt": prompt,
        "prompt_unknown_chars": unknown,
        "vocab_size": int(logits.numel()),
        "log_vocab": r(math.log(logits.numel())),
        "entropy_vs_temperature": entropy_table(logits),
        "nucleus_curve_tau_1": nucleus_curve(logits),
        "order_trap_top_p_0_9": order_trap(logits),
        "top10": [{"token": tok.token_str(int(t)), "id": int(t), "prob": r(float(probs[t]))} for t in top],
        # The whole distribution, so the report's sampling lab re-computes everything in the browser.
        # float32 logits as exact decimal strings would be wasteful; 6 decimals is far below any
        # kept-set boundary effect the lab can show (the browser test compares on these same values).
        "distribution": {
            "tokens": [tok.token_str(i) for i in range(logits.numel())],
            "logits": [round(float(x), 6) for x in logits],
        },
    }
