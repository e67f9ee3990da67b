"""genprobe's :class:`~genprobe.engine.sampling.SamplerConfig` as vLLM ``SamplingParams`` — exactly, or refused.

What vLLM's V1 sampler does (``vllm/v1/sample/sampler.py``, ``Sampler.forward``): allowed-token
whitelist → penalties (repetition over prompt + output, CTRL-style; presence/frequency over the
output) → greedy argmax, or temperature → min-p → top-k → top-p → draw. genprobe's adjustments
(bans, penalties) also come first and its greedy is the argmax of the adjusted logits, so:

=======================  ===============================================================================
``greedy``               ``temperature=0`` (vLLM's greedy is an explicit argmax, not τ→0)
``temperature``          ``temperature``
``top_k`` / ``top_p``    ``top_k`` (0 = off) / ``top_p`` (1 = off); both keep top-k ties and the token
                         that crosses p. One difference no setting can remove: when top-p's cut falls
                         inside a group of *exactly* tied logits, vLLM keeps the member(s) its sort puts
                         last and genprobe the lowest ids — the same probabilities on other tie members
``min_p``                ``min_p``
``ban_ids``              ``allowed_token_ids`` = every other id (exact ``-inf``; vLLM's ``logit_bias`` is
                         clamped to ±100, which is not a ban)
``repetition_penalty``   ``repetition_penalty`` (both count prompt + generated tokens)
``presence_penalty``,    same names (both count generated tokens only)
``frequency_penalty``
``order``                vLLM's order is fixed: temperature → min-p → top-k → top-p. Another order is
                         accepted only when it gives the same distribution for these settings (greedy,
                         or the *active* stages run in an equivalent order); otherwise refused.
``no_repeat_ngram``      refused: vLLM has no n-gram ban
=======================  ===============================================================================

A field this module does not know (a sampler added later) is refused while it is not at its default,
so a new setting can never be dropped silently: add it to ``_MAPPERS`` with its exact vLLM form.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Callable

from ..engine.sampling import ORDERS, SamplerConfig

VLLM_ORDER = ("temp", "min_p", "top_k", "top_p")  # vllm/v1/sample/sampler.py: temperature → min_p → top-k/top-p
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


def _order(cfg: SamplerConfig, vocab: int) -> dict:
    if cfg.greedy:
        return {}
    ours = _active_stages(cfg, ORDERS[cfg.order])
    if not _equivalent(ours, _active_stages(cfg, VLLM_ORDER)):
        raise UnsupportedSamplerError(
            f"sampler order {cfg.order!r} applies {' → '.join(ours)}; vLLM always applies temperature → min_p → top_k → "
            f"top_p, which gives a different distribution for these settings. Use order='vllm' to scan with vLLM"
        )
    return {}


def _sampling(cfg: SamplerConfig, vocab: int) -> dict:
    if cfg.greedy:
        return {"temperature": 0.0}
    return {"temperature": float(cfg.temperature), "top_k": int(cfg.top_k or 0),
            "top_p": float(cfg.top_p) if cfg.top_p is not None else 1.0, "min_p": float(cfg.min_p or 0.0)}


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
    return {"repetition_penalty": float(cfg.repetition_penalty), "presence_penalty": float(cfg.presence_penalty),
            "frequency_penalty": float(cfg.frequency_penalty)}


def _no_repeat_ngram(cfg: SamplerConfig, vocab: int) -> dict:
    if cfg.no_repeat_ngram:
        raise UnsupportedSamplerError(
            f"no_repeat_ngram={cfg.no_repeat_ngram} has no vLLM equivalent (vLLM bans no n-grams); "
            "scan with genprobe's own engine or drop the setting"
        )
    return {}


# SamplerConfig field → the function that maps it (a function may cover several fields).
_MAPPERS: dict[str, Callable[[SamplerConfig, int], dict]] = {
    "greedy": _sampling, "temperature": _sampling, "top_k": _sampling, "top_p": _sampling, "min_p": _sampling,
    "order": _order,
    "ban_ids": _bans,
    "repetition_penalty": _penalties, "presence_penalty": _penalties, "frequency_penalty": _penalties,
    "no_repeat_ngram": _no_repeat_ngram,
}


def _unknown_settings(cfg: SamplerConfig) -> list[str]:
    default = {f.name: f.default for f in fields(SamplerConfig)}
    return [f"{f.name}={getattr(cfg, f.name)!r}" for f in fields(cfg)
            if f.name not in _MAPPERS and getattr(cfg, f.name) != default.get(f.name)]


def sampling_kwargs(cfg: SamplerConfig, vocab_size: int) -> dict[str, Any]:
    """``SamplingParams`` keyword arguments equivalent to ``cfg`` for a model of ``vocab_size`` ids; raises if inexact."""
    unknown = _unknown_settings(cfg)
    if unknown:
        raise UnsupportedSamplerError(
            f"no exact vLLM form is known for {', '.join(unknown)}; genprobe refuses to approximate it"
        )
    kw: dict[str, Any] = {}
    for fn in dict.fromkeys(_MAPPERS.values()):  # each mapper once, in table order
        kw.update(fn(cfg, vocab_size))
    return kw


def to_sampling_params(cfg: SamplerConfig, vocab_size: int, max_new_tokens: int, *, seed: int | None = None,
                       eos_id: int | None = None, **extra: Any) -> Any:
    """A vLLM ``SamplingParams`` for ``cfg``: exactly ``max_new_tokens`` tokens unless ``eos_id`` is generated."""
    from ._vllm import require_vllm

    require_vllm()
    from vllm import SamplingParams

    if int(max_new_tokens) != max_new_tokens or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    stop = {"stop_token_ids": [int(eos_id)]} if eos_id is not None else {}
    # ignore_eos: the model config's own end-of-text id must not stop a scan; only ``eos_id`` (if given) does.
    return SamplingParams(max_tokens=int(max_new_tokens), seed=seed, ignore_eos=True, detokenize=False,
                          **sampling_kwargs(cfg, vocab_size), **stop, **extra)
