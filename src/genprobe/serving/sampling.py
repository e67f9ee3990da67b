"""genprobe's :class:`~genprobe.engine.samplers.SamplerConfig` as vLLM ``SamplingParams`` — exactly, or refused.

vLLM's V1 sampler applies bans → penalties → greedy argmax, or temperature → min-p → top-k → top-p → draw. A config
maps when each active stage's ``vllm`` method (:mod:`genprobe.engine.samplers.stages`) has its vLLM form (the rest
is refused by name), when stages whose arithmetic differs between engines run with ``engine="vllm"``, and when the
active stages run in an order equivalent to vLLM's fixed one. A field no stage maps is refused while it is not at
its default, so a new setting is never dropped silently.
"""

from __future__ import annotations

from itertools import groupby
from typing import Any

from ..engine.samplers import SamplerConfig
from ..engine.samplers.stages import (
    STAGES,
    TEMPERATURE,
    TOP_K,
    Truncation,
    UnsupportedSamplerError,
    active_truncations,
    refuse_for,
)

# Stages that commute exactly with each other: top-k keeps a rank set, and dividing by τ > 0 keeps ranks.
_COMMUTING = {TEMPERATURE, TOP_K}


def _canonical(stages: list[Truncation]) -> list[Truncation]:
    """``stages`` with each run of mutually commuting stages in one fixed order: equal for equivalent orders."""
    runs = groupby(stages, key=lambda s: s in _COMMUTING)
    return [s for commuting, run in runs for s in (sorted(run, key=str) if commuting else run)]


def sampling_kwargs(cfg: SamplerConfig, vocab_size: int) -> dict[str, Any]:
    """``SamplingParams`` keyword arguments equal to ``cfg`` for a model of ``vocab_size`` ids; raises if inexact."""
    kw: dict[str, Any] = {}
    for stage in STAGES:
        kw.update(stage.vllm(cfg, vocab_size))
    refuse_for(cfg, "vllm", "vLLM", STAGES)
    stages = active_truncations(cfg)
    if _canonical(stages) != _canonical(active_truncations(cfg, "vllm")):
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

    if int(max_new_tokens) != max_new_tokens or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    stop: dict[str, Any] = {"stop_token_ids": [int(eos_id)]} if eos_id is not None else {}
    # ignore_eos: the model config's own end-of-text id must not stop a scan; only ``eos_id`` (if given) does.
    return require_vllm().SamplingParams(
        max_tokens=int(max_new_tokens),
        seed=seed,
        ignore_eos=True,
        detokenize=False,
        **sampling_kwargs(cfg, vocab_size),
        **stop,
        **extra,
    )
