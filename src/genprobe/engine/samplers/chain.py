"""The sampler chain: pure functions of logits, validated parameters (:class:`~.stages.SamplerConfig`), an explicit
order and engine.

:func:`process_logits` maps raw logits (B, V) to the logits whose softmax is the sampling distribution; a removed
token gets ``-inf``, never 0 (a 0 is a legal logit whose probability is not 0). The **adjustments** (bans,
repetition/presence/frequency penalties, no-repeat-n-gram, DRY) come first in every order and also apply when greedy;
``order`` places the **truncations** (top-n-σ, top-k, typical-p, top-p, min-p, XTC) and **temperature**
(:data:`~.stages.ORDERS`: genprobe's default ``trunc_then_temp`` keeps a set that does not depend on τ, as
llama.cpp's order does; ``temp_then_trunc``; and the ``hf``, ``vllm`` and ``llama.cpp`` engines' own orders).

``engine`` decides each stage's arithmetic and each penalty's scope (each stage's docstring in :mod:`.stages` says
how): ``hf`` (transformers' processors and warpers, op for op), ``vllm`` (its PyTorch sampler), ``llama.cpp`` (its
float32 candidate-array samplers; penalties over the last 64 tokens) or ``genprobe`` (exact: float64 nucleus mass,
ties to the lower id). It defaults to the order's name when that is an engine, else ``genprobe``.
``SamplerConfig.preset(name, **overrides)`` gives an engine's own defaults (``PRESETS``, sources cited there) with
its order and arithmetic; a bare ``SamplerConfig(order="llama.cpp", top_p=0.9)`` uses llama.cpp's arithmetic and
order but only the parameters given.

Greedy is its own path: the argmax of the *adjusted* logits, never emulated with τ≈0 (truncations, typical-p, XTC
and τ are sampling stages, as in HF where warpers only run when sampling). NaN logits raise ValueError in every
path; so does ``+inf`` when sampling (softmax of ``+inf`` is undefined).
"""

from __future__ import annotations

import math

import torch

from .llama_cpp import Candidates
from .stages import DRY, XTC, SamplerConfig


def check_logits(logits: torch.Tensor, sampling: bool = True) -> bool:
    """Raise ValueError naming the first bad row when logits hold NaN (or +inf when sampling).

    Returns True when every logit is finite (the common case, decided by one reduction).
    """
    if math.isfinite(float(logits.sum())):
        return True
    bad = torch.isnan(logits)
    if sampling:
        bad = bad | (logits == float("inf"))
    if bool(bad.any()):
        row = int(bad.any(-1).nonzero()[0, 0]) if logits.dim() == 2 else 0
        what = "NaN" if bool(torch.isnan(logits).any()) else "+inf"
        raise ValueError(
            f"logits hold {what} (first bad row {row}): the model output is not a distribution "
            "(overflow in half precision, or corrupted weights?)"
        )
    return False


def adjust_logits(
    logits: torch.Tensor, history: torch.Tensor | None, cfg: SamplerConfig, prompt_len: int = 0
) -> torch.Tensor:
    """Bans, penalties, no-repeat-n-gram and DRY (the order-independent first stages); a new float32 tensor."""
    B, V = logits.shape
    out = logits.float()
    if cfg.adjustments:
        hist = torch.empty(B, 0, dtype=torch.long, device=logits.device)  # what stages read (none: no history)
        if cfg.uses_history and history is not None and history.numel():
            hist = history.to(torch.long)
            hist = hist[None, :].expand(B, -1) if hist.dim() == 1 else hist
            if hist.shape[0] != B:
                raise ValueError(f"history has {hist.shape[0]} rows but logits have {B}")
            if int(hist.max()) >= V:
                raise ValueError(f"history holds token id {int(hist.max())} outside the vocabulary of {V}")
        for stage in cfg.adjustments:  # every stage is out of place
            out = stage.adjust(out, hist, cfg, prompt_len)
    return out.clone() if out is logits else out


def process_logits(
    logits: torch.Tensor,
    history: torch.Tensor | None,
    cfg: SamplerConfig,
    prompt_len: int = 0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Final logits (B, V) whose softmax is the sampling distribution; removed tokens are ``-inf``.

    ``history`` (B, t) holds the tokens the penalties and DRY read (prompt + generated); entries
    < 0 are padding; the first ``prompt_len`` columns are the prompt (presence/frequency penalties
    count only what follows). ``generator`` feeds XTC's per-step draw. In greedy mode only the
    adjustments apply (truncation and τ never change an argmax).
    """
    if logits.dim() == 1:
        logits = logits[None, :]
    if logits.dim() != 2:
        raise ValueError(f"logits must be (batch, vocab), got shape {tuple(logits.shape)}")
    all_finite = check_logits(logits, sampling=not cfg.greedy)
    z = adjust_logits(logits, history, cfg, prompt_len)
    may_empty = not all_finite or cfg.ban_ids or cfg.no_repeat_ngram or DRY.active(cfg)  # penalties keep x finite
    if may_empty and not torch.isfinite(z).any(-1).all():  # truncations always keep one token
        raise ValueError("every token is banned at this step (no_repeat_ngram / ban_ids left nothing)")
    if cfg.greedy:
        return z
    stages = cfg.truncations  # the order's active truncation/temperature stages, with the engine's arithmetic
    draws = None  # XTC's uniform [0, 1) draw per row, from the generation's generator: it must be reproducible
    if XTC in stages:
        if generator is None:
            raise ValueError("XTC draws a random number per step: pass the generation's torch.Generator")
        draws = torch.rand(z.shape[0], generator=generator, device=generator.device)
    if cfg.engine == "llama.cpp":  # each row's candidate array through the stages; removed tokens come back -inf
        out = torch.full_like(z, float("-inf"))
        for b, row in enumerate(z.detach().float().cpu().numpy()):
            c = Candidates(row)
            for stage in stages:
                stage.candidates(c, cfg, float(draws[b]) if draws is not None else 0.0)
            out[b, torch.from_numpy(c.ids).to(out.device)] = torch.from_numpy(c.logit).to(out)
        return out
    for stage in stages:
        z = stage.logits(z, cfg, draws)
    return z


def sample_next(
    logits: torch.Tensor,
    history: torch.Tensor | None,
    cfg: SamplerConfig,
    generator: torch.Generator | None = None,
    processed: torch.Tensor | None = None,
    prompt_len: int = 0,
) -> torch.Tensor:
    """Next token ids (B,): argmax of the processed logits if greedy, else one draw with ``generator``.

    ``processed`` lets a caller pass logits it already ran through :func:`process_logits`.
    """
    if logits.dim() == 1:
        logits = logits[None, :]
    if cfg.greedy and cfg.is_identity:
        check_logits(logits, sampling=False)
        return logits.argmax(dim=-1)
    z = process_logits(logits, history, cfg, prompt_len, generator) if processed is None else processed
    if cfg.greedy:
        return z.argmax(dim=-1)
    return torch.multinomial(torch.softmax(z, dim=-1), 1, generator=generator).squeeze(1)


def kept_set_size(logits: torch.Tensor, cfg: SamplerConfig, history: torch.Tensor | None = None) -> int:
    """How many tokens keep a non-zero probability for one row of ``logits`` (V,) under ``cfg``."""
    if logits.dim() != 1:
        raise ValueError(f"kept_set_size takes one row of logits (V,), got shape {tuple(logits.shape)}")
    gen = torch.Generator().manual_seed(0) if XTC.active(cfg) else None
    z = process_logits(logits[None, :], None if history is None else history.reshape(1, -1), cfg, generator=gen)
    return 1 if cfg.greedy else int(torch.isfinite(z).sum())
