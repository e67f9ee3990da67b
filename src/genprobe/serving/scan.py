"""Loop scan through vLLM in-process: the same prompts, sampler and records as genprobe's own engine scan.

vLLM contributes only a batch generator (:func:`vllm_batches`) to the one scan
(:func:`genprobe.loops.scan.scan_batches`): an in-process fast path beside the Backend route, because a backend
request cannot carry the penalties and min-p that loop studies sweep. Greedy scans give our engine's tokens up to
float noise (tested); sampled ones (seed ``seed + i`` for prompt ``i``) agree in distribution only. A
:class:`~genprobe.engine.samplers.stages.SamplerConfig` maps to ``SamplingParams`` exactly or is refused by name
(:func:`sampling_kwargs`: each stage's ``vllm`` form, a field no stage maps refused while not at its default, and an
order equivalent to vLLM's fixed temperature → min-p → top-k → top-p). :func:`compare_loop_rates` holds a served scan
against ours: both loop rates with Wilson 95% intervals, and the per-prompt agreement of verdicts and tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby
from typing import Any, Sequence

from ..engine.samplers.stages import (
    STAGES,
    TEMPERATURE,
    TOP_K,
    SamplerConfig,
    Truncation,
    UnsupportedSamplerError,
    active_truncations,
    refuse_for,
)
from ..loops.scan import Batch, GenerateBatch, ScanEngine, ScanOptions, ScanResult, check_prompts
from .engine import EngineOptions, ServingEngine, require_vllm, served_model, shared_engine, size_for_workload

# Stages that commute exactly with each other: top-k keeps a rank set, and dividing by τ > 0 keeps ranks.
_COMMUTING = {TEMPERATURE, TOP_K}


def sampling_kwargs(cfg: SamplerConfig, vocab_size: int) -> dict[str, Any]:
    """``SamplingParams`` keyword arguments equal to ``cfg`` for a model of ``vocab_size`` ids; raises if inexact."""
    kw: dict[str, Any] = {}
    for stage in STAGES:
        kw.update(stage.vllm(cfg, vocab_size))
    refuse_for(cfg, "vllm", "vLLM", STAGES)
    stages = active_truncations(cfg)

    def canonical(stages: list[Truncation]) -> list[Truncation]:  # each run of commuting stages in one fixed order
        runs = groupby(stages, key=lambda s: s in _COMMUTING)
        return [s for commuting, run in runs for s in (sorted(run, key=str) if commuting else run)]

    if canonical(stages) != canonical(active_truncations(cfg, "vllm")):
        raise UnsupportedSamplerError(
            f"sampler order {cfg.order!r} applies {' → '.join(map(str, stages))}; vLLM always applies temperature → "
            "min_p → top_k → top_p, which gives a different distribution for these settings. Use order='vllm' "
            "to scan with vLLM"
        )
    return kw


def to_sampling_params(
    cfg: SamplerConfig, vocab_size: int, max_new_tokens: int, *, seed: int | None = None, **extra: Any
) -> Any:
    """A vLLM ``SamplingParams`` for ``cfg`` (``extra``: more of its keywords): exactly ``max_new_tokens`` tokens."""
    # ignore_eos: the model config's own end-of-text id must not stop a scan
    params = sampling_kwargs(cfg, vocab_size) | extra
    return require_vllm().SamplingParams(
        max_tokens=int(max_new_tokens), seed=seed, ignore_eos=True, detokenize=False, **params
    )


def vllm_batches(engine: ServingEngine) -> GenerateBatch:
    """The scan's batch generator in vLLM (for :func:`genprobe.loops.scan.scan_batches`): one ``generate`` call per
    batch, prompt ``i`` sampled with seed ``seed + i``; a bad prompt is refused before the batch runs."""

    def generate_batch(b: Batch) -> list[tuple]:
        check_prompts(b, engine.vocab_size, engine.max_model_len)
        o = b.options
        seeds = [None if b.sampler.greedy else o.seed + i for i in range(b.first, b.first + len(b.prompts))]
        params = [to_sampling_params(b.sampler, engine.vocab_size, o.max_new_tokens, seed=s) for s in seeds]
        outs = engine.generate(b.prompts, params, use_tqdm=o.progress)
        return [(list(o.outputs[0].token_ids), o.outputs[0].finish_reason == "length") for o in outs]

    return generate_batch


def vllm_scan_backend(options: EngineOptions) -> ScanEngine:
    """vLLM as the engine of :func:`genprobe.loops.scan.scan_loop_settings` (``backend=``), started with
    these :class:`~genprobe.serving.engine.EngineOptions` and sized to the scan as verify-serving sizes it to its
    checks: the context fits the longest prompt plus the new tokens, and the KV budget what the scan's sequences
    need (a CPU machine's default memory fraction often leaves none)."""

    def check(sampler: SamplerConfig, model: Any, n_ctx: int) -> None:
        sampling_kwargs(sampler, model.vocab_size)

    def start(model: Any, scan: ScanOptions, ids: Sequence[Sequence[int]], log: Any) -> tuple[GenerateBatch, dict]:
        if model.source is None:
            raise ValueError("vLLM serves a model directory: this model was not loaded from one")
        # vLLM is sized on the directory it serves: a genprobe checkpoint has no config.json until it is exported
        served = served_model(model.source)
        sequences = max(1, min(len(ids), scan.batch_size))
        longest, new = max(len(p) for p in ids), scan.max_new_tokens
        sized = size_for_workload(served.path, options, longest_prompt=longest, new_tokens=new, sequences=sequences)
        engine = shared_engine(served, sized)
        log(f"vLLM engine ready ({engine.startup_seconds:.1f} s)")
        return vllm_batches(engine), {"backend": "vllm", "vllm": engine.describe()}

    return ScanEngine("vLLM", check, start)


@dataclass
class RateComparison:
    """Our engine's scan vs the served model's scan of the same prompts."""

    JSON_PROPERTIES = ("consistent",)  # computed from the fields, kept in the JSON form

    n: int
    ours_rate: float
    ours_ci95: tuple[float, float]
    served_rate: float
    served_ci95: tuple[float, float]
    ours_degenerate_rate: float  # exact loop, near loop or repetitive tail (the repair objective)
    served_degenerate_rate: float
    verdict_agreement: float  # fraction of prompts with the same looping yes/no
    token_agreement: float  # fraction of prompts with identical generated tokens

    @property
    def consistent(self) -> bool:
        """The served loop rate lies inside our engine's 95% interval."""
        return self.ours_ci95[0] <= self.served_rate <= self.ours_ci95[1]


def compare_loop_rates(ours: ScanResult, served: ScanResult) -> RateComparison:
    """Compare two scans of the same prompts (refuses scans of different prompt sets)."""
    a, b = ours.records, served.records
    if len(a) != len(b) or any(x.prompt_ids != y.prompt_ids for x, y in zip(a, b, strict=True)):
        raise ValueError("the two scans are not over the same prompts in the same order")
    if not a:
        raise ValueError("the scans hold no records")
    sa, sb = ours.summary, served.summary
    return RateComparison(
        n=len(a),
        ours_rate=sa.loop_rate,
        ours_ci95=(sa.loop_rate_ci95[0], sa.loop_rate_ci95[1]),
        served_rate=sb.loop_rate,
        served_ci95=(sb.loop_rate_ci95[0], sb.loop_rate_ci95[1]),
        ours_degenerate_rate=sa.degenerate_rate,
        served_degenerate_rate=sb.degenerate_rate,
        verdict_agreement=sum(x.measures.looping == y.measures.looping for x, y in zip(a, b, strict=True)) / len(a),
        token_agreement=sum(x.tokens == y.tokens for x, y in zip(a, b, strict=True)) / len(a),
    )
