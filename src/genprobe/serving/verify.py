"""verify-serving: does a vLLM deployment compute the model's log-probabilities?

A serving engine changes *how* the forward is computed — continuous batching, prefix caching,
chunked prefill, reduced precision — and each can go wrong without the text looking wrong. Each
phase below sends a workload that exercises one of them (greedy, ``prompt_logprobs`` and per-step
top-k ``logprobs``) and compares every returned log-probability with float32 recomputation of the
same tokens (:mod:`genprobe.serving.compare`):

==================  ==============================================================================
``alone``           short prompts, one request per call (nothing shared)
``batch``           prompts of mixed lengths and mixed token budgets in one call: requests join and
                    leave the running batch (continuous batching)
``prefix_cached``   the same long prefix twice; the second request reads the first one's KV blocks
                    (``num_cached_tokens`` > 0 shows it did)
``prefix_uncached`` the second request again with ``skip_reading_prefix_cache`` (recomputed)
``diverge_boundary`` a request that shares exactly a whole number of KV blocks with a cached one, then differs
``diverge_inside``  one that shares those blocks and half of the next one, then differs: only whole blocks of
                    the shared prefix may be served from the cache (a hash over part of a block would
                    serve the half-shared block too); more cached tokens than shared ones is a bug alone
``chunked_prefill`` prompts longer than ``max_num_batched_tokens``: prefilled in several chunks
==================  ==============================================================================

Each deployment dtype is its own engine, always compared with float32 recomputation. A float32 deployment is judged
on verify-cache's scale on max |Δ log p| plus "a top-1 token that differs is at least suspicious"
(:func:`genprobe.serving.verdict.serving_verdict`): the engine-correctness check. A reduced-precision one (bfloat16,
float16) is judged on its gap ratio to float32 over the same model recomputed honestly in its dtype
(:mod:`genprobe.serving.precision`), the float32 distances reported beside it.
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from .._io import json_safe
from .compare import LogprobStats, ReferenceLogprobs, compare_outputs, request_gap
from .engine import CPU_BLOCK_SIZE, EngineOptions, ServingEngine, shared_engine, size_for_workload
from .precision import gap_verdict
from .verdict import Thresholds, serving_verdict, worst_verdict

PHASES = (
    "alone",
    "batch",
    "prefix_cached",
    "prefix_uncached",
    "diverge_boundary",
    "diverge_inside",
    "chunked_prefill",
)


@dataclass
class PhaseReport:
    """One phase on one deployment: the largest |Δ log p|, top-1 agreement, first divergence, verdict."""

    phase: str
    dtype: str
    requests: int = 0
    positions: int = 0
    max_abs_dlogp: float | None = None
    mean_abs_dlogp: float | None = None
    top1_agreement: float | None = None
    top1_disagreements: int = 0
    first_divergence: dict | None = None
    verdict: str = "pass"
    cached_tokens: int | None = None  # prefix phases: tokens of the second request served from the cache
    shared_tokens: int | None = None  # diverge phases: leading tokens the second request shares with the first
    prefill_chunks: int | None = None  # chunked phase: most chunks any prompt was prefilled in
    note: str | None = None
    skipped: str | None = None
    judged_on: str = "reference"  # "reference": float32 recomputation | "gap": reduced precision's gap ratio
    gap: float | None = None  # reduced precision: the worst request's mean |Δ log p| to float32 (returned ids)
    floor: float | None = None  # the same statistic of the same precision computed honestly, same request
    gap_ratio: float | None = None  # gap / floor, what the verdict of a reduced-precision phase reads


@dataclass
class ServingReport:
    """verify-serving's result for every deployment dtype and phase."""

    model: str
    reference: str
    phases: list[PhaseReport]
    thresholds: Thresholds
    steps: int
    top_k: int
    engines: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        """The worst phase verdict over all deployments."""
        return worst_verdict([p.verdict for p in self.phases if not p.skipped])

    def verdict_by_dtype(self) -> dict[str, str]:
        """The worst phase verdict per deployment dtype."""
        out: dict[str, list[str]] = {}
        for p in self.phases:
            out.setdefault(p.dtype, []).append(p.verdict if not p.skipped else "pass")
        return {k: worst_verdict(v) for k, v in out.items()}

    def to_dict(self) -> dict:
        """JSON form."""
        return {
            "model": self.model,
            "reference": self.reference,
            "steps": self.steps,
            "top_k": self.top_k,
            "thresholds": json_safe(self.thresholds),
            "verdict": self.verdict,
            "verdict_by_dtype": self.verdict_by_dtype(),
            "phases": [json_safe(p) for p in self.phases],
            "engines": self.engines,
            "errors": self.errors,
        }


# ---- workloads ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Workload:
    """Token-id prompts for each phase, sized to the engine's context and token budget."""

    alone: list[list[int]]
    batch: list[list[int]]
    prefix_first: list[int]
    prefix_second: list[int]
    long: list[list[int]]


def _stream(pool: Sequence[Sequence[int]], vocab: int, seed: int) -> Callable[[int], list[int]]:
    """``take(n)``: the next n tokens of the user's prompts cycled, or of seeded random ids when none are given."""
    rng = random.Random(seed)
    flat = [int(t) for p in pool for t in p]
    pos = [0]

    def take(n: int) -> list[int]:
        if flat:
            out = [flat[(pos[0] + i) % len(flat)] for i in range(n)]
            pos[0] += n
            return out
        return [rng.randrange(vocab) for _ in range(n)]

    return take


BATCH_FRACTIONS = (0.0, 0.15, 0.3, 0.45, 0.6, 0.75, 0.9, 1.0)  # batch phase: prompt lengths as fractions of room


def sized_for_checks(
    model_dir: str | os.PathLike, options: EngineOptions, prompts: Sequence[Sequence[int]], steps: int
) -> EngineOptions:
    """``options`` sized to what the phases need (:func:`genprobe.serving.engine.size_for_workload`): room for the
    longest prompt, and at least 4 × max(token budget, KV block) so that prefixes span cached blocks and long
    prompts several prefill chunks; as many sequences as the batch phase sends at once."""
    unit = max(options.max_num_batched_tokens or 0, options.block_size or CPU_BLOCK_SIZE)
    longest = max([4 * unit, *(len(p) for p in prompts)])
    return size_for_workload(
        model_dir, options, longest_prompt=longest, new_tokens=steps, sequences=len(BATCH_FRACTIONS)
    )


def build_workload(
    room: int, budget: int, vocab: int, prompts: Sequence[Sequence[int]] = (), seed: int = 0
) -> Workload:
    """Prompts for every phase: ``room`` = longest admissible prompt, ``budget`` = max_num_batched_tokens."""
    if room < 4:
        raise ValueError(f"the context leaves room for prompts of only {room} tokens; lower the number of steps")
    take = _stream(prompts, vocab, seed)
    short_max = max(2, min(room, budget))
    alone = [list(p)[:room] for p in prompts if p] or [take(n) for n in sorted({2, max(2, short_max // 2), short_max})]
    lengths = [max(2, round(2 + (room - 2) * f)) for f in BATCH_FRACTIONS]
    batch = [take(n) for n in lengths]
    prefix = take(max(2, room - 4))
    long = [take(n) for n in sorted({room, max(budget + 1, (room + budget + 1) // 2)}) if budget < n <= room]
    return Workload(alone, batch, prefix + take(4), prefix + take(4), long)


# ---- phases ------------------------------------------------------------------------------------------
@dataclass
class DeploymentReference:
    """What one deployment is compared with: float32 recomputation, and for a reduced-precision deployment the same
    model recomputed in its dtype (``honest``: the floor of :mod:`genprobe.serving.precision`)."""

    float32: ReferenceLogprobs
    honest: ReferenceLogprobs | None = None

    @property
    def vocab_size(self) -> int:
        """Output ids of the reference model."""
        return self.float32.vocab_size


def precision_judgement(outputs: Sequence[Any], ref: DeploymentReference, noise: float) -> dict[str, Any]:
    """The gap-ratio verdict of a reduced-precision phase: each request's gap to float32 over its own floor, the
    worst request deciding (:func:`genprobe.serving.precision.gap_verdict`)."""
    assert ref.honest is not None
    worst = (0.0, 0.0, -1.0)
    for out in outputs:
        ids = list(out.prompt_token_ids) + list(out.outputs[0].token_ids)
        float32 = ref.float32(ids)
        gap, floor = request_gap(out, float32), request_gap(out, float32, honest=ref.honest(ids))
        ratio = gap_verdict(gap, floor, noise)[1]
        if ratio > worst[2]:
            worst = (gap, floor, ratio)
    verdict, ratio = gap_verdict(worst[0], worst[1], noise)
    return {"verdict": verdict, "judged_on": "gap", "gap": worst[0], "floor": worst[1], "gap_ratio": ratio}


def _params(steps: int, k: int, prompt_logprobs: bool = True, **kw: Any) -> Any:
    from vllm import SamplingParams

    return SamplingParams(
        temperature=0.0,
        max_tokens=steps,
        logprobs=k,
        prompt_logprobs=k if prompt_logprobs else None,
        detokenize=False,
        ignore_eos=True,
        **kw,
    )


def _report(
    phase: str, dtype: str, outputs: Sequence[Any], ref: DeploymentReference, th: Thresholds, **extra: Any
) -> PhaseReport:
    st: LogprobStats = compare_outputs(outputs, ref.float32, th.noise)
    judged: dict[str, Any] = {"verdict": serving_verdict(st.max_abs_dlogp, st.top1_disagreements, th)}
    if ref.honest is not None:
        judged = precision_judgement(outputs, ref, th.noise)
    return PhaseReport(
        phase,
        dtype,
        len(outputs),
        st.positions,
        st.max_abs_dlogp,
        st.mean_abs_dlogp,
        st.top1_agreement,
        st.top1_disagreements,
        json_safe(st.first) if st.first else None,
        **judged,
        **extra,
    )


def run_phases(
    engine: ServingEngine, ref: DeploymentReference, work: Workload, steps: int, k: int, th: Thresholds
) -> list[PhaseReport]:
    """All phases on one started engine (its dtype is the deployment under test)."""
    dtype = engine.options.dtype
    sp = _params(steps, k)
    out = [engine.generate([p], sp)[0] for p in work.alone]
    reports = [_report("alone", dtype, out, ref, th)]
    budgets = [_params(max(1, steps - 3 * (i % 3)), k) for i in range(len(work.batch))]
    reports.append(_report("batch", dtype, engine.generate(work.batch, budgets), ref, th))
    reports += _prefix_phases(engine, ref, work, steps, k, th)
    reports += _divergence_phases(engine, ref, work, steps, k, th)
    reports.append(_chunked_phase(engine, ref, work, sp, th))
    return reports


def _prefix_phases(
    engine: ServingEngine, ref: DeploymentReference, work: Workload, steps: int, k: int, th: Thresholds
) -> list[PhaseReport]:
    dtype = engine.options.dtype
    # vLLM never reads the prefix cache for a request that asks for prompt_logprobs (it must score every
    # prompt token), so these requests compare generation steps only; step 0 is computed on the cached prefix.
    engine.llm.reset_prefix_cache()
    engine.generate([work.prefix_first], _params(steps, k, prompt_logprobs=False))
    hit = engine.generate([work.prefix_second], _params(steps, k, prompt_logprobs=False))
    miss = engine.generate(
        [work.prefix_second], _params(steps, k, prompt_logprobs=False, skip_reading_prefix_cache=True)
    )
    cached, uncached = int(hit[0].num_cached_tokens or 0), int(miss[0].num_cached_tokens or 0)
    note = None
    if cached == 0:
        bs = engine.block_size
        why = (
            "prefix caching is off"
            if not engine.options.enable_prefix_caching
            else f"the shared prefix ({len(work.prefix_first) - 4} tokens) is shorter than a KV block ({bs})"
        )
        note = f"the second request was not served from the prefix cache: {why}"
    return [
        _report("prefix_cached", dtype, hit, ref, th, cached_tokens=cached, note=note),
        _report("prefix_uncached", dtype, miss, ref, th, cached_tokens=uncached),
    ]


def diverging_request(base: Sequence[int], shared: int, vocab: int) -> list[int]:
    """``base``'s first ``shared`` tokens, then every later token replaced by another id (same length)."""
    return [int(t) for t in base[:shared]] + [(int(t) + 1) % vocab for t in base[shared:]]


def divergence_points(length: int, block: int) -> dict[str, int]:
    """Shared-prefix lengths for a request of ``length`` tokens: a block boundary, and half a block past it.

    Both leave at least two tokens after the divergence (vLLM never serves a prompt's last token from the
    cache). Inside: half a block past the boundary, or, when that does not fit, half-way into the first block
    (then no whole block is shared and nothing may be served). Left out when the prompt holds no whole block
    and two more tokens."""
    blocks = (length - 2) // block
    if blocks < 1:
        return {}
    boundary = block * max(1, blocks // 2)
    out = {"diverge_boundary": boundary}
    if block >= 2:
        past = boundary + block // 2
        out["diverge_inside"] = past if past <= length - 2 else block // 2
    return out


def reuse_check(cached: int, shared: int, block: int) -> str | None:
    """Why serving ``cached`` prompt tokens from the cache is wrong for a request sharing ``shared`` tokens, or None.

    A correct prefix cache serves whole blocks of the shared prefix only: at most ``shared`` rounded down to
    the block. More means a lookup that matched tokens the requests do not share (the logits may still look
    close when the wrong tokens' keys happen to be similar, so this is checked on its own)."""
    allowed = shared // block * block
    if cached > allowed:
        return (
            f"{cached} prompt tokens were served from the prefix cache, but the request shares only {shared} "
            f"leading tokens with the cached one ({allowed} in whole blocks of {block})"
        )
    return None


def _divergence_phases(
    engine: ServingEngine, ref: DeploymentReference, work: Workload, steps: int, k: int, th: Thresholds
) -> list[PhaseReport]:
    dtype = engine.options.dtype
    block = engine.block_size
    points = divergence_points(len(work.prefix_first), block)
    reports = []
    for phase in ("diverge_boundary", "diverge_inside"):
        if phase not in points:
            why = f"the prefix workload ({len(work.prefix_first)} tokens) spans fewer than two KV blocks of {block}"
            reports.append(PhaseReport(phase, dtype, skipped=why))
            continue
        shared = points[phase]
        engine.llm.reset_prefix_cache()
        engine.generate([work.prefix_first], _params(steps, k, prompt_logprobs=False))
        second = diverging_request(work.prefix_first, shared, ref.vocab_size)
        out = engine.generate([second], _params(steps, k, prompt_logprobs=False))
        cached = int(out[0].num_cached_tokens or 0)
        rep = _report(phase, dtype, out, ref, th, cached_tokens=cached, shared_tokens=shared)
        wrong = reuse_check(cached, shared, block) if engine.options.enable_prefix_caching else None
        if wrong:
            rep.verdict, rep.note = "bug", wrong
        elif cached == 0 and engine.options.enable_prefix_caching:
            rep.note = "nothing was served from the prefix cache (the engine did not reuse the shared blocks)"
        reports.append(rep)
    return reports


def _chunked_phase(
    engine: ServingEngine, ref: DeploymentReference, work: Workload, sp: Any, th: Thresholds
) -> PhaseReport:
    budget = scheduler_budget(engine)
    if not work.long:
        return PhaseReport(
            "chunked_prefill",
            engine.options.dtype,
            skipped=(
                f"max_num_batched_tokens ({budget}) is not below the longest admissible prompt: set it lower to force "
                "chunked prefill"
            ),
        )
    chunks = max(math.ceil(len(p) / budget) for p in work.long)
    return _report(
        "chunked_prefill", engine.options.dtype, engine.generate(work.long, sp), ref, th, prefill_chunks=chunks
    )


def scheduler_budget(engine: ServingEngine) -> int:
    """The engine's per-step token budget (``max_num_batched_tokens`` as vLLM resolved it)."""
    return int(engine.llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens)


# ---- the whole check ---------------------------------------------------------------------------------
def honest_reference(
    path: str | os.PathLike, dtype: str, log: Callable[[str], None] | None = None
) -> ReferenceLogprobs | None:
    """The reference model recomputed in a reduced-precision deployment's ``dtype`` (its floor), None for float32."""
    import torch

    from ..model.load import load_model

    if dtype == "float32":
        return None
    if log:
        log(f"recomputing the reference in {dtype} too (the floor of that precision)")
    return ReferenceLogprobs(load_model(path, dtype=getattr(torch, dtype)))


def verify_serving(
    model: str | os.PathLike,
    reference: str | os.PathLike | None = None,
    *,
    dtypes: Sequence[str] = ("float32", "bfloat16"),
    options: EngineOptions | None = None,
    prompts: Sequence[Sequence[int]] = (),
    steps: int = 16,
    top_k: int = 5,
    thresholds: Thresholds | None = None,
    seed: int = 0,
    log: Callable[[str], None] | None = None,
) -> ServingReport:
    """Serve ``model`` with vLLM once per dtype and compare every phase with float32 recomputation of ``reference``.

    ``reference`` defaults to the served weights themselves (a different directory checks that the
    deployment serves the weights you expect). ``options`` are the deployment's engine settings;
    their ``dtype`` is replaced by each of ``dtypes`` in turn.
    """
    from ..model.load import load_model
    from .model_dir import served_model

    if steps < 1 or top_k < 1:
        raise ValueError(f"steps and top_k must be >= 1, got steps={steps}, top_k={top_k}")
    if not dtypes:
        raise ValueError("give at least one deployment dtype")
    th = thresholds or Thresholds()
    opts = options or EngineOptions()
    served = served_model(model)
    opts = sized_for_checks(served.path, opts, prompts, steps)
    ref_model = load_model(reference if reference is not None else served.path)
    if ref_model.vocab_size != served.vocab_size:
        served.cleanup()
        raise ValueError(
            f"the reference has {ref_model.vocab_size} output ids but the served model has {served.vocab_size}"
        )
    float32 = ReferenceLogprobs(ref_model)
    report = ServingReport(str(model), str(reference if reference is not None else model), [], th, steps, top_k)
    # the engine is keyed by the source, so a later scan of the same checkpoint reuses it; the export goes when the
    # last engine holding it stops
    for dt in dtypes:
        if log:
            log(f"starting vLLM ({dt}) on {served.path} …")
        engine = shared_engine(served, replace(opts, dtype=dt))
        report.engines.append(engine.describe())
        work = build_workload(engine.max_model_len - steps, scheduler_budget(engine), served.vocab_size, prompts, seed)
        ref = DeploymentReference(float32, honest_reference(ref_model.source or served.path, dt, log))
        report.phases += run_phases(engine, ref, work, steps, top_k, th)
    return report
