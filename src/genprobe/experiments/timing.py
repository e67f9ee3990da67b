"""Seed §3.3.2 / §3.4.4: the KV cache saves ~28× token forwards, yet wall-clock barely moves.

Both paths go through the engine's ``generate`` (same sampler, same seed); only ``mode`` differs.
Wall time is the median of ``reps`` runs after one warm-up; the counted compute ratio comes from
the engine's own ``token_forwards`` counter, and the closed-form ratio from seed §3.3.2.
"""

from __future__ import annotations

import statistics
import time

import torch

from ..engine.generate import generate
from ..model import GPT, GPTConfig
from ._common import r

BATCHES = (1, 16, 64)
SCALING_TOKENS = (32, 64, 128)


def naive_token_forwards(prompt_len: int, new_tokens: int) -> int:
    """Seed §3.3.2: Σ_{i<N} (P + i) tokens processed by full recomputation."""
    return new_tokens * prompt_len + new_tokens * (new_tokens - 1) // 2


def _time(model, prompts, new_tokens: int, mode: str, reps: int, budget_s: float) -> tuple[float, int, int]:
    """(median seconds, token forwards, runs): at least one timed run, more while under ``budget_s``."""
    generate(model, prompts, min(2, new_tokens), mode=mode)  # warm-up (allocator, kernels)
    times, forwards = [], 0
    while len(times) < reps and (not times or sum(times) < budget_s):
        t0 = time.perf_counter()
        res = generate(model, prompts, new_tokens, mode=mode)
        times.append(time.perf_counter() - t0)
        forwards = int(res.token_forwards)
    return statistics.median(times), forwards, len(times)


def time_modes(model: GPT, prompt_ids: list[int], batch: int, new_tokens: int, reps: int = 3,
               budget_s: float = 5.0) -> dict:
    """Naive vs cached wall time (median of up to ``reps`` runs, fewer past ``budget_s``) and token forwards."""
    prompts = [list(prompt_ids)] * batch
    with torch.inference_mode():
        naive_s, naive_f, naive_n = _time(model, prompts, new_tokens, "naive", reps, budget_s)
        cached_s, cached_f, cached_n = _time(model, prompts, new_tokens, "cached", reps, budget_s)
    return {
        "device": "cpu",
        "batch": batch,
        "new_tokens": new_tokens,
        "naive_s": r(naive_s),
        "cached_s": r(cached_s),
        "speedup": r(naive_s / cached_s, 2),
        "naive_token_forwards": naive_f,
        "cached_token_forwards": cached_f,
        "compute_ratio": r(naive_f / cached_f, 1),
        "runs": [naive_n, cached_n],
    }


def run_cache_timing(model: GPT, prompt_ids: list[int], new_tokens: int = 50, batches=BATCHES, reps: int = 3,
                     budget_s: float = 5.0) -> dict:
    """The ``cache_timing`` key: naive vs cached at each batch size beside the compute ratio."""
    rows = [time_modes(model, prompt_ids, b, new_tokens, reps, budget_s) for b in batches]
    P, N = len(prompt_ids), new_tokens
    formula = naive_token_forwards(P, N)
    return {
        "prompt_len": P,
        "new_tokens": N,
        "threads": torch.get_num_threads(),
        "reps": reps,
        "compute_ratio": rows[0]["compute_ratio"],
        "token_forwards": {
            "naive_formula": formula,
            "single_pass": P + N,
            "formula_ratio": r(formula / (P + N), 1),
            "naive_counted": rows[0]["naive_token_forwards"] // rows[0]["batch"],
            "cached_counted": rows[0]["cached_token_forwards"] // rows[0]["batch"],
        },
        "rows": rows,
    }


def scaling_config(vocab_size: int = 1202, max_new: int = max(SCALING_TOKENS), prompt_len: int = 7,
                   small: bool = False) -> GPTConfig:
    """The seed's larger random model: 8 layers, d_model 768, 12 heads, d_ff 3072 (``small``: d_model 256, for --quick)."""
    block = max(160, prompt_len + max_new + 1)
    if small:
        return GPTConfig(vocab_size=vocab_size, n_layer=8, n_head=4, d_model=256, d_ff=1024, block_size=block)
    return GPTConfig(vocab_size=vocab_size, n_layer=8, n_head=12, d_model=768, d_ff=3072, block_size=block)


def run_cache_scaling(prompt_ids: list[int], vocab_size: int = 1202, new_tokens=SCALING_TOKENS, reps: int = 1,
                      cfg: GPTConfig | None = None, seed: int = 0, small: bool = False,
                      max_naive_s: float = 150.0) -> dict:
    """The ``cache_scaling`` key: the same comparison on a random 8×768 model over generation lengths.

    The naive loop grows quadratically; a length whose naive run is predicted (from the previous
    length, scaled by the token-forward count) to exceed ``max_naive_s`` is listed in ``skipped``.
    """
    cfg = cfg or scaling_config(vocab_size, max(new_tokens), len(prompt_ids), small=small)
    torch.manual_seed(seed)
    model = GPT(cfg).eval()
    rows, skipped = [], []
    P = len(prompt_ids)
    for n in new_tokens:
        if rows:
            prev = rows[-1]
            predicted = prev["naive_s"] * naive_token_forwards(P, n) / naive_token_forwards(P, prev["new_tokens"])
            if predicted > max_naive_s:
                skipped.append({"new_tokens": n, "predicted_naive_s": r(predicted, 1), "budget_s": max_naive_s})
                continue
        row = time_modes(model, prompt_ids, 1, n, reps)
        row.pop("batch")
        rows.append(row)
    return {
        "model": f"{cfg.n_layer} layers, d_model {cfg.d_model}, {model.num_parameters():,} parameters, random weights",
        "config": cfg.to_dict(),
        "parameters": model.num_parameters(),
        "shrunk_for_quick": small,
        "reps": reps,
        "rows": rows,
        "skipped": skipped,
    }
