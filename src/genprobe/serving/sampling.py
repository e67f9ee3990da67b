"""genprobe's :class:`~genprobe.engine.samplers.SamplerConfig` as vLLM ``SamplingParams`` — exactly, or refused.

What vLLM's V1 sampler does (``vllm/v1/sample/sampler.py``, ``Sampler.forward``): allowed-token
whitelist → penalties (repetition over prompt ∪ output; presence/frequency over the output) → greedy
argmax, or temperature → min-p → top-k → top-p → draw. genprobe's ``engine="vllm"`` reproduces that
arithmetic op for op (:mod:`genprobe.engine.samplers`), so a config maps exactly when

=======================  ===============================================================================
``greedy``               ``temperature=0`` (vLLM's greedy is an explicit argmax, not τ→0)
``temperature``,         same names; ``top_k`` 0 = off, ``top_p`` 1 = off, ``min_p`` 0 = off
``top_k/top_p/min_p``
``ban_ids``              ``allowed_token_ids`` = every other id (an exact ``-inf``; vLLM's ``logit_bias``
                         is clamped to ±100, which is not a ban)
``repetition_penalty``,  same names (repetition: prompt ∪ output; presence/frequency: output)
``presence_penalty``,
``frequency_penalty``
``engine``               must be ``"vllm"`` whenever a stage whose arithmetic differs between engines is
                         active (penalties, τ ≠ 1, truncation): genprobe's and HF's top-p break ties and
                         round differently. Greedy with bans only, or plain τ = 1 sampling, maps from any
                         engine.
``order``                vLLM's order is fixed (temperature → min-p → top-k → top-p); another order is
                         accepted only when the *active* stages then run in an equivalent order (top-k
                         commutes with τ: both keep the ranking)
=======================  ===============================================================================

Refused, because vLLM has no such sampler: ``no_repeat_ngram``, ``typical_p``, ``top_n_sigma``, DRY,
XTC, contrastive search (``penalty_alpha``), a penalty window (``penalty_last_n``). A field this module
does not know (a sampler added later) is refused while it is not at its default, so a new setting can
never be dropped silently: add it to ``_MAPPERS`` with its exact vLLM form.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Callable

from ..engine.samplers import ORDERS, SamplerConfig

VLLM_ORDER = ORDERS["vllm"]  # vllm/v1/sample/sampler.py: temperature → min_p → top-k → top-p
# Adjacent stages that commute exactly: top-k keeps a rank set, and dividing by τ > 0 keeps ranks.
_COMMUTE = {frozenset(("temp", "top_k"))}


class UnsupportedSamplerError(ValueError):
    """A sampler setting that vLLM cannot express exactly (named in the message)."""


def _active_stages(cfg: SamplerConfig, order: tuple[str, ...]) -> list[str]:
    on = {
        "temp": cfg.temperature != 1.0,
        "top_k": bool(cfg.top_k),
        "top_p": cfg.top_p is not None and cfg.top_p < 1.0,
        "min_p": bool(cfg.min_p),
        "typical": cfg.typical_p is not None and cfg.typical_p < 1.0,
        "top_n_sigma": bool(cfg.top_n_sigma),
        "xtc": cfg.xtc_active,
    }
    return [s for s in order if on[s]]


def _equivalent(ours: list[str], theirs: list[str]) -> bool:
    """True when ``ours`` can be turned into ``theirs`` by swapping adjacent commuting stages."""
    if sorted(ours) != sorted(theirs):
        return False
    seq = list(ours)
    for target_i, stage in enumerate(theirs):  # bubble each of vLLM's stages into place through commuting swaps
        j = seq.index(stage, target_i)
        while j > target_i:
            if frozenset((seq[j - 1], seq[j])) not in _COMMUTE:
                return False
            seq[j - 1], seq[j] = seq[j], seq[j - 1]
            j -= 1
    return True


def _penalised(cfg: SamplerConfig) -> bool:
    return cfg.repetition_penalty != 1.0 or cfg.presence_penalty != 0.0 or cfg.frequency_penalty != 0.0


def _order_engine(cfg: SamplerConfig, vocab: int) -> dict:
    stages = [] if cfg.greedy else _active_stages(cfg, ORDERS[cfg.order])
    arithmetic = (["penalties"] if _penalised(cfg) else []) + stages
    if arithmetic and cfg.engine != "vllm":
        raise UnsupportedSamplerError(
            f"engine={cfg.engine!r} computes {', '.join(arithmetic)} with its own arithmetic (rounding, tie-breaking); "
            "vLLM's differs. Describe vLLM's sampler with engine='vllm' (e.g. order='vllm', or "
            "SamplerConfig.preset('vllm', ...)) to run it through vLLM"
        )
    if stages and not _equivalent(stages, _active_stages(cfg, VLLM_ORDER)):
        raise UnsupportedSamplerError(
            f"sampler order {cfg.order!r} applies {' → '.join(stages)}; "
            "vLLM always applies temperature → min_p → top_k → "
            f"top_p, which gives a different distribution for these settings. Use order='vllm' to scan with vLLM"
        )
    return {}


def _sampling(cfg: SamplerConfig, vocab: int) -> dict:
    if cfg.greedy:
        return {"temperature": 0.0}
    return {
        "temperature": float(cfg.temperature),
        "top_k": int(cfg.top_k or 0),
        "top_p": float(cfg.top_p) if cfg.top_p is not None else 1.0,
        "min_p": float(cfg.min_p or 0.0),
    }


def _bans(cfg: SamplerConfig, vocab: int) -> dict:
    if not cfg.ban_ids:
        return {}
    bad = sorted(i for i in set(cfg.ban_ids) if i >= vocab)
    if bad:
        raise UnsupportedSamplerError(f"ban_ids {bad} are outside the model's {vocab} ids")
    banned = set(cfg.ban_ids)
    allowed = [i for i in range(vocab) if i not in banned]
    if not allowed:
        raise UnsupportedSamplerError(f"ban_ids ban all {vocab} ids: nothing left to generate")
    return {"allowed_token_ids": allowed}


def _penalties(cfg: SamplerConfig, vocab: int) -> dict:
    if cfg.penalty_last_n not in (None, -1):
        raise UnsupportedSamplerError(
            f"penalty_last_n={cfg.penalty_last_n}: vLLM's penalties see the whole prompt and output, it has no window"
        )
    return {
        "repetition_penalty": float(cfg.repetition_penalty),
        "presence_penalty": float(cfg.presence_penalty),
        "frequency_penalty": float(cfg.frequency_penalty),
    }


def _refuse_if(active: Callable[[SamplerConfig], bool], what: str) -> Callable[[SamplerConfig, int], dict]:
    """A mapper for a sampler vLLM does not have: nothing to pass when it is off, an error when it is on."""

    def mapper(cfg: SamplerConfig, vocab: int) -> dict:
        if active(cfg):
            raise UnsupportedSamplerError(
                f"{what} has no vLLM equivalent; scan with genprobe's own engine or turn it off"
            )
        return {}

    return mapper


_no_repeat = _refuse_if(lambda c: c.no_repeat_ngram > 0, "no_repeat_ngram (an n-gram ban)")
_typical = _refuse_if(lambda c: c.typical_p is not None and c.typical_p < 1.0, "typical_p (locally typical sampling)")
_sigma = _refuse_if(lambda c: bool(c.top_n_sigma), "top_n_sigma")
_dry = _refuse_if(lambda c: c.dry_active, "DRY (dry_multiplier > 0)")
_xtc = _refuse_if(lambda c: c.xtc_active, "XTC (xtc_probability > 0)")
_contrastive = _refuse_if(lambda c: c.is_contrastive, "contrastive search (penalty_alpha > 0)")

# SamplerConfig field → the function that maps it (one function may cover several fields). Samplers vLLM
# lacks come first so their error is the one reported.
_MAPPERS: dict[str, Callable[[SamplerConfig, int], dict]] = {
    "no_repeat_ngram": _no_repeat,
    "typical_p": _typical,
    "top_n_sigma": _sigma,
    "dry_multiplier": _dry,
    "dry_base": _dry,
    "dry_allowed_length": _dry,
    "dry_last_n": _dry,
    "dry_sequence_breakers": _dry,
    "xtc_probability": _xtc,
    "xtc_threshold": _xtc,
    "penalty_alpha": _contrastive,
    "penalty_last_n": _penalties,
    "order": _order_engine,
    "engine": _order_engine,
    "greedy": _sampling,
    "temperature": _sampling,
    "top_k": _sampling,
    "top_p": _sampling,
    "min_p": _sampling,
    "ban_ids": _bans,
    "repetition_penalty": _penalties,
    "presence_penalty": _penalties,
    "frequency_penalty": _penalties,
}


def _unknown_settings(cfg: SamplerConfig) -> list[str]:
    default = {f.name: f.default for f in fields(SamplerConfig)}
    return [
        f"{f.name}={getattr(cfg, f.name)!r}"
        for f in fields(cfg)
        if f.name not in _MAPPERS and getattr(cfg, f.name) != default.get(f.name)
    ]


def sampling_kwargs(cfg: SamplerConfig, vocab_size: int) -> dict[str, Any]:
    """``SamplingParams`` keyword arguments equal to ``cfg`` for a model of ``vocab_size`` ids; raises if inexact."""
    unknown = _unknown_settings(cfg)
    if unknown:
        raise UnsupportedSamplerError(
            f"no exact vLLM form is known for {', '.join(unknown)}; genprobe refuses to approximate it"
        )
    kw: dict[str, Any] = {}
    for fn in dict.fromkeys(_MAPPERS.values()):  # each mapper once, in table order
        kw.update(fn(cfg, vocab_size))
    return kw


def to_sampling_params(
    cfg: SamplerConfig,
    vocab_size: int,
    max_new_tokens: int,
    *,
    seed: int | None = None,
    eos_id: int | None = None,
    **extra: Any,
) -> Any:
    """A vLLM ``SamplingParams`` for ``cfg``: exactly ``max_new_tokens`` tokens unless ``eos_id`` is generated."""
    from ._vllm import require_vllm

    require_vllm()
    from vllm import SamplingParams

    if int(max_new_tokens) != max_new_tokens or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    stop: dict[str, Any] = {"stop_token_ids": [int(eos_id)]} if eos_id is not None else {}
    # ignore_eos: the model config's own end-of-text id must not stop a scan; only ``eos_id`` (if given) does.
    return SamplingParams(
        max_tokens=int(max_new_tokens),
        seed=seed,
        ignore_eos=True,
        detokenize=False,
        **sampling_kwargs(cfg, vocab_size),
        **stop,
        **extra,
    )
