"""Loop scan through vLLM: the same prompts, sampler and records as :func:`genprobe.loops.scan.scan_loops`.

Generation runs in ``LLM.generate`` (continuous batching, any parallelism the engine was started
with); loop measures are genprobe's own (:mod:`genprobe.metrics`) on the returned token ids, and the
result is the same :class:`~genprobe.loops.scan.ScanResult` as our engine's scan, so a
``loops scan --backend vllm`` result is read by the same code. Greedy scans give the same tokens as
our engine up to float noise (tested); sampled scans use vLLM's random streams (seed ``seed + i``
for prompt ``i``), so they agree in distribution, not token by token.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from typing_extensions import Unpack

from ..engine.samplers import SamplerConfig
from ..loops.scan import ScanOptions, ScanResult, scan_batches, study_sampler
from .engine import ServingEngine
from .sampling import sampling_kwargs, to_sampling_params


def scan_loops_vllm(
    engine: ServingEngine,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    sampler: SamplerConfig | None = None,
    **options: Unpack[ScanOptions],
) -> ScanResult:
    """:func:`genprobe.loops.scan.scan_loops` with generation in vLLM (``batch_size`` prompts per generate call).

    Same arguments and result (:func:`genprobe.loops.scan.scan_batches`); prompt ``i`` is sampled with seed
    ``seed + i``; ``eos_id`` is banned, never a stop (fixed-length loop studies), exactly as in our engine's scan."""
    _check_prompts(engine, prompts, max_new_tokens)
    seed, progress = options.get("seed", 0), options.get("progress", False)

    def generate_batch(chunk: list[list[int]], sampler: SamplerConfig, start: int, _: int) -> list[tuple]:
        params = [
            to_sampling_params(sampler, engine.vocab_size, max_new_tokens, seed=None if sampler.greedy else seed + i)
            for i in range(start, start + len(chunk))
        ]
        outs = engine.generate(chunk, params, use_tqdm=progress)
        return [(list(o.outputs[0].token_ids), o.outputs[0].finish_reason == "length") for o in outs]

    return scan_batches(generate_batch, prompts, max_new_tokens, sampler, **options)


def _check_prompts(engine: ServingEngine, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> None:
    if not prompts:
        return  # scan_batches refuses an empty scan
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty: every prompt needs at least one token")
        if min(p) < 0 or max(p) >= engine.vocab_size:
            raise ValueError(f"prompt {i} holds a token id outside [0, {engine.vocab_size})")
    longest = max(len(p) for p in prompts)
    if longest + max_new_tokens > engine.max_model_len:
        raise ValueError(
            f"context overflow: longest prompt ({longest} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
            f"engine's max_model_len {engine.max_model_len}"
        )


def check_sampler_vllm(sampler: SamplerConfig, vocab_size: int, eos_id: int | None = None) -> None:
    """Raise :class:`~genprobe.serving.sampling.UnsupportedSamplerError` now (before any engine starts) when vLLM
    cannot express ``sampler`` exactly (with the end-token ban a scan adds)."""
    sampling_kwargs(study_sampler(sampler, eos_id), vocab_size)


def scan_study_vllm(
    engine: ServingEngine,
    study: Any,
    ids: Sequence[Sequence[int]],
    texts: Sequence[str] | None = None,
    *,
    sampler: SamplerConfig | None = None,
    desc: str = "scan",
) -> ScanResult:
    """:meth:`genprobe.loops.study.LoopStudy.scan` through vLLM: the study's budget, batch, seed, bans, detector
    settings and decoder, so the result is what the study would have measured on our engine."""
    options = study.scan_options(texts, desc)
    return scan_loops_vllm(engine, ids, study.cfg.max_new_tokens, sampler or study.sampler, **options)


def vllm_scan_backend(options: Any = None) -> Callable[..., tuple[Callable[..., Any], dict[str, Any]]]:
    """The vLLM backend of :func:`genprobe.loops.scan_settings.scan_loop_settings` (``backend=``), with these
    :class:`~genprobe.serving.engine.EngineOptions`. Every setting is checked before vLLM starts (one it cannot
    express exactly raises :class:`~genprobe.serving.sampling.UnsupportedSamplerError`, never approximated). vLLM is
    sized to the scan as verify-serving sizes it to its checks: the context fits the longest prompt plus the new
    tokens, and the KV budget what the scan's sequences need (a CPU machine's default memory fraction often leaves
    none)."""
    from .engine import EngineOptions, shared_engine, size_for_workload
    from .model_dir import served_model
    from .sampling import UnsupportedSamplerError

    def backend(
        model: Any,
        study: Any,
        samplers: dict[str, SamplerConfig],
        ids: Sequence[Sequence[int]],
        log: Callable[[str], None],
    ) -> tuple[Callable[..., Any], dict[str, Any]]:
        if model.source is None:
            raise ValueError("vLLM serves a model directory: this model was not loaded from one")
        for name, sampler in samplers.items():
            try:
                check_sampler_vllm(sampler, model.vocab_size, model.eos_id)
            except UnsupportedSamplerError as exc:
                raise UnsupportedSamplerError(f"vLLM cannot run the {name!r} setting exactly: {exc}") from None
        # vLLM is sized on the directory it serves: a genprobe checkpoint has no config.json until it is exported
        served = served_model(model.source)
        sized = size_for_workload(
            served.path,
            options or EngineOptions(),
            longest_prompt=max(len(p) for p in ids),
            new_tokens=study.cfg.max_new_tokens,
            sequences=max(1, min(len(ids), study.cfg.batch_size)),
        )
        engine = shared_engine(served, sized)
        log(f"vLLM engine ready ({engine.startup_seconds:.1f} s)")

        def scan(ids: Any, texts: Any, *, sampler: Any, desc: str) -> Any:
            return scan_study_vllm(engine, study, ids, texts, sampler=sampler, desc=desc)

        return scan, {"backend": "vllm", "vllm": engine.describe()}

    return backend
