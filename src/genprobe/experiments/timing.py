"""Compute saved vs time saved by the KV cache: the engine's ``generate`` naive and cached (only ``mode`` differs),
the median wall time of ``reps`` runs after a warm-up, beside its ``token_forwards`` count and the closed form."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import ClassVar

import torch

from .._io import json_safe
from ..engine.generate import generate
from ..engine.runner import ModelLike
from ..model.config import GPTConfig
from ..model.gpt import GPT
from ._common import Rounded, r

BATCHES = (1, 16, 64)
SCALING_TOKENS = (32, 64, 128)
MAX_NAIVE_S = 150.0  # the scaling model's naive loop: a length predicted to take longer is skipped


def naive_token_forwards(prompt_len: int, new_tokens: int) -> int:
    """Σ_{i<N} (P + i): tokens processed when every step recomputes the whole prefix (no cache)."""
    return new_tokens * prompt_len + new_tokens * (new_tokens - 1) // 2


def _time(
    model: ModelLike, prompts: list[list[int]], new_tokens: int, mode: str, reps: int, budget_s: float
) -> tuple[float, int, int]:
    """(median seconds, token forwards, runs): at least one timed run, more while under ``budget_s``."""
    generate(model, prompts, min(2, new_tokens), mode=mode)  # warm-up (allocator, kernels)
    times: list[float] = []
    forwards = 0
    while len(times) < reps and (not times or sum(times) < budget_s):
        t0 = time.perf_counter()
        res = generate(model, prompts, new_tokens, mode=mode)
        times.append(time.perf_counter() - t0)
        forwards = int(res.token_forwards)
    return statistics.median(times), forwards, len(times)


@dataclass(frozen=True)
class ModeTiming(Rounded):
    """Naive vs cached generation of ``new_tokens`` at one batch size: median wall seconds and token forwards."""

    device: ClassVar[str] = "cpu"
    JSON_KEYS = (
        "device batch new_tokens naive_s cached_s speedup naive_token_forwards cached_token_forwards compute_ratio runs"
    )
    DIGITS_OF = {"speedup": 2, "compute_ratio": 1}

    batch: int
    new_tokens: int
    naive_s: float
    cached_s: float
    naive_token_forwards: int
    cached_token_forwards: int
    runs: tuple[int, int]  # timed runs of (naive, cached)

    @property
    def speedup(self) -> float:
        """Wall-clock ratio naive / cached."""
        return self.naive_s / self.cached_s

    @property
    def compute_ratio(self) -> float:
        """Token-forward ratio naive / cached (the arithmetic the cache saves)."""
        return self.naive_token_forwards / self.cached_token_forwards


def time_modes(
    model: ModelLike, prompt_ids: list[int], batch: int, new_tokens: int, reps: int = 3, budget_s: float = 5.0
) -> ModeTiming:
    """Naive vs cached wall time (median of up to ``reps`` runs, fewer past ``budget_s``) and token forwards of
    ``model``: a genprobe GPT or any engine runner (``Model.runner``: a ``transformers`` model too)."""
    prompts = [list(prompt_ids)] * batch
    with torch.inference_mode():
        naive_s, naive_f, naive_n = _time(model, prompts, new_tokens, "naive", reps, budget_s)
        cached_s, cached_f, cached_n = _time(model, prompts, new_tokens, "cached", reps, budget_s)
    return ModeTiming(batch, new_tokens, naive_s, cached_s, naive_f, cached_f, (naive_n, cached_n))


@dataclass(frozen=True)
class CacheTiming:
    """The ``cache_timing`` key: naive vs cached at each batch size, beside the counted and closed-form compute."""

    prompt_len: int
    new_tokens: int
    threads: int
    reps: int
    rows: list[ModeTiming]
    tokens_match: dict | None = None  # {"rows", "identical"}: rows generated both ways, and how many agree

    def to_dict(self) -> dict:
        """JSON form (the ``cache_timing`` key of ``ch3_case.json``; ``tokens_match`` once measured)."""
        P, N, first = self.prompt_len, self.new_tokens, self.rows[0]
        formula = naive_token_forwards(P, N)
        return {
            "prompt_len": P,
            "new_tokens": N,
            "threads": self.threads,
            "reps": self.reps,
            "compute_ratio": r(first.compute_ratio, 1),
            "token_forwards": {
                "naive_formula": formula,
                "single_pass": P + N,
                "formula_ratio": r(formula / (P + N), 1),
                "naive_counted": first.naive_token_forwards // first.batch,
                "cached_counted": first.cached_token_forwards // first.batch,
            },
            "rows": self.rows,
        } | ({"tokens_match": self.tokens_match} if self.tokens_match else {})


def run_cache_timing(
    model: ModelLike, prompt_ids: list[int], new_tokens: int = 50, batches=BATCHES, reps: int = 3, budget_s: float = 5.0
) -> CacheTiming:
    """Naive vs cached at each batch size beside the compute ratio (``model``: as :func:`time_modes` takes)."""
    rows = [time_modes(model, prompt_ids, b, new_tokens, reps, budget_s) for b in batches]
    return CacheTiming(len(prompt_ids), new_tokens, torch.get_num_threads(), reps, rows)


def scaling_config(
    vocab_size: int = 1202, max_new: int = max(SCALING_TOKENS), prompt_len: int = 7, small: bool = False
) -> GPTConfig:
    """The chapter's larger random model: 8 layers, d_model 768, 12 heads, d_ff 3072 (``small``, --quick: 256 wide)."""
    block = max(160, prompt_len + max_new + 1)
    heads, width, ff = (4, 256, 1024) if small else (12, 768, 3072)
    return GPTConfig(vocab_size=vocab_size, n_layer=8, n_head=heads, d_model=width, d_ff=ff, block_size=block)


@dataclass(frozen=True)
class CacheScaling:
    """The ``cache_scaling`` key: the naive / cached comparison on a larger random model over lengths."""

    config: GPTConfig
    parameters: int
    shrunk_for_quick: bool
    reps: int
    rows: list[ModeTiming]
    skipped: list[dict]  # lengths not timed: the naive loop was predicted to exceed the budget

    def to_dict(self) -> dict:
        """JSON form (rows without the batch size: always 1 here)."""
        cfg = self.config
        return {
            "model": f"{cfg.n_layer} layers, d_model {cfg.d_model}, {self.parameters:,} parameters, random weights",
            "config": cfg,
            "parameters": self.parameters,
            "shrunk_for_quick": self.shrunk_for_quick,
            "reps": self.reps,
            "rows": [{k: v for k, v in json_safe(row).items() if k != "batch"} for row in self.rows],
            "skipped": self.skipped,
        }


def run_cache_scaling(
    prompt_ids: list[int],
    vocab_size: int = 1202,
    new_tokens=SCALING_TOKENS,
    reps: int = 1,
    cfg: GPTConfig | None = None,
    small: bool = False,
) -> CacheScaling:
    """The same comparison on a random 8×768 model (seeded) over generation lengths; a length whose naive run is
    predicted (the previous one's, scaled by token forwards) to exceed :data:`MAX_NAIVE_S` is listed in ``skipped``."""
    cfg = cfg or scaling_config(vocab_size, max(new_tokens), len(prompt_ids), small=small)
    torch.manual_seed(0)
    model = GPT(cfg).eval()
    rows: list[ModeTiming] = []
    skipped: list[dict] = []
    P = len(prompt_ids)
    for n in new_tokens:
        if rows:
            prev = rows[-1]
            predicted = prev.naive_s * naive_token_forwards(P, n) / naive_token_forwards(P, prev.new_tokens)
            if predicted > MAX_NAIVE_S:
                skipped.append({"new_tokens": n, "predicted_naive_s": r(predicted, 1), "budget_s": MAX_NAIVE_S})
                continue
        rows.append(time_modes(model, prompt_ids, 1, n, reps))
    return CacheScaling(cfg, model.num_parameters(), small, reps, rows, skipped)
