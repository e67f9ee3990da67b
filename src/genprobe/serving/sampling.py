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
no stage maps (a sampler added later) is refused while it is not at its default, so a new setting can
never be dropped silently: each stage's ``vllm`` method (:mod:`genprobe.engine.samplers.stages`) holds its
exact vLLM form or its refusal.
"""

from __future__ import annotations

from typing import Any

from ..engine.samplers import SamplerConfig
from ..engine.samplers.stages import STAGES, TEMPERATURE, TOP_K, UnsupportedSamplerError, active_truncations, refuse_for

# Adjacent stages that commute exactly: top-k keeps a rank set, and dividing by τ > 0 keeps ranks.
_COMMUTE = {frozenset((TEMPERATURE, TOP_K))}


def _equivalent(ours: list[Any], theirs: list[Any]) -> bool:
    """True when ``ours`` can be turned into ``theirs`` by swapping adjacent commuting stages."""
    if sorted(map(str, ours)) != sorted(map(str, theirs)):
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


def sampling_kwargs(cfg: SamplerConfig, vocab_size: int) -> dict[str, Any]:
    """``SamplingParams`` keyword arguments equal to ``cfg`` for a model of ``vocab_size`` ids; raises if inexact."""
    kw: dict[str, Any] = {}
    for stage in STAGES:
        kw.update(stage.vllm(cfg, vocab_size))
    refuse_for(cfg, "vllm", "vLLM", STAGES)
    stages = active_truncations(cfg)
    if not _equivalent(stages, active_truncations(cfg, "vllm")):
        raise UnsupportedSamplerError(
            f"sampler order {cfg.order!r} applies {' → '.join(map(str, stages))}; vLLM always applies temperature → "
            "min_p → top_k → top_p, which gives a different distribution for these settings. Use order='vllm' "
            "to scan with vLLM"
        )
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
