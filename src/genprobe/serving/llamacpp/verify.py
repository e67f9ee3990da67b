"""verify-serving through llama.cpp: does a GGUF deployment compute its weights' logits, phase by phase?

Each phase drives llama.cpp the way a deployment does and compares the logits of EVERY position (the full
vocabulary: max |Δ log p| over all ids, top-1 with a float-noise tie) twice:

* with **float32 recomputation** of the same weights (``genprobe.load(file)``: dequantized by ``transformers``, or
  ``reference=`` a float directory of the same weights), :class:`~genprobe.serving.compare.ReferenceLogprobs`;
* with **llama.cpp's own prefill** of the same tokens (one ``llama_decode`` call, fresh cache, same settings).

====================  ==========================================================================================
``prefill``           each prompt's positions in one ``llama_decode`` call (vs recomputation only)
``decode``            a prompt prefilled, then greedy steps one token per call through the KV cache
``batch``             prompts of mixed lengths as separate sequences (``seq_id`` 0..n-1) of one context: all
                      prefilled in one ``llama_decode`` call, then one call per step for all of them
                      (:class:`~genprobe.serving.llamacpp.engine.SequenceBatch`)
``prompt_cache``      the ``Llama`` object's prompt cache across calls (``Llama.generate``): a second prompt sharing
                      all but the last 4 tokens of the first is served the shared prefix from the cache
``prompt_cache_diverge``  one sharing only the first half, then different (same length): at most that half may be
                      served; serving more is a bug on its own (:func:`genprobe.serving.verify.reuse_check`)
``context_shift``     the context filled, then llama.cpp's context shift (``tools/completion/completion.cpp``:
                      keep ``n_keep`` tokens, discard half of the rest with ``llama_memory_seq_rm``, move the
                      remainder back with ``llama_memory_seq_add``) and greedy steps after it; the reference is
                      the float32 cache shifted the same way (:func:`shifted_cache_logprobs`), not recomputation
====================  ==========================================================================================

**Engine correctness vs quantization.** Recomputation equals llama.cpp's arithmetic up to float rounding only when
every weight is F32 and the KV cache is F32 (``kv_type="f32"``): then every phase is judged on recomputation
(``judged_on="reference"``) with verify-cache's scale (:func:`genprobe.serving.verdict.serving_verdict`).
Otherwise llama.cpp rounds cached K/V to F16 and quantizes the activations of every product with a quantized weight
(Q8_0 / Q8_K / Q8_1, the weight type's ``vec_dot_type`` in ``ggml/src/ggml-cpu/ggml-cpu.c``), which recomputation
with the dequantized weights does not do. And llama.cpp's one-token decode and its multi-token prompt path do not
agree with each other either on a quantized file (measured, SmolLM2 Q4_1: mean top-5 |Δ log p| 0.09 between them,
0.11 from either to float32; on the F32 file 5e-6) — most likely because ggml-cpu picks its matrix-product kernels by
batch size. Neither comparison can then be held to float noise. A quantized phase is judged on its **gap ratio**
(``judged_on="gap"``): its :func:`top_gap` to recomputation (the mean over positions of |Δ log p| over the
reference's top-5 ids) over the same statistic of llama.cpp's own one-call prefill of the same tokens (the file's
quantization gap on exactly those positions; for the context shift, the kept tokens recomputed unshifted):
≤ 2 pass, ≤ 5 suspicious, more a bug (:mod:`genprobe.serving.precision`: the rule of every reduced-precision
deployment, vLLM's bfloat16 too). A cache serving the wrong prompt's entries moves a phase by far more than
quantization does; an engine error smaller than the quantization noise can only be seen on
an F32 file of the same model, which is why the F32 run is the engine-correctness check and a quantized run the
deployment check.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..._io import json_safe
from ..compare import Divergence, LogprobStats, ReferenceLogprobs
from ..precision import gap_verdict
from ..verdict import Thresholds, serving_verdict, worst_verdict
from ..verify import PhaseReport, ServingReport, Workload, build_workload, diverging_request, reuse_check
from .engine import LlamaCppDecodeError, LlamaCppModel, greedy_picker, model_file_types

PHASES = ("prefill", "decode", "batch", "prompt_cache", "prompt_cache_diverge", "context_shift")
EXACT_TYPES = {"F32"}  # tensor types whose products llama.cpp computes in float32 (no activation quantization)


@dataclass
class LlamaCppPhaseReport(PhaseReport):
    """A :class:`~genprobe.serving.verify.PhaseReport` (its Δ fields: against float32 recomputation) plus the same
    positions against llama.cpp's own one-call prefill, the gap statistic of quantized files, and what was judged."""

    self_max_abs_dlogp: float | None = None
    self_top1_agreement: float | None = None
    self_first_divergence: dict | None = None
    gap_top5: float | None = None  # mean over positions of the mean |Δ log p| over the reference's top-5 ids
    reference_verdict: str | None = None  # the recomputation comparison on the verdict scale, judged or not


@dataclass
class Rows:
    """One sequence of a phase: its token ids, the logits rows llama.cpp returned (row t predicts token t + 1) and
    how many leading tokens were the prompt (the rest were generated)."""

    ids: list[int]
    logits: np.ndarray
    prompt_len: int
    first_row: int = 0  # logits[0] is row ``first_row`` of the sequence (earlier rows are not compared)


# ---- comparing dense logits rows ---------------------------------------------------------------------------------
def _log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def compare_rows(stats: LogprobStats, seq: Rows, reference: np.ndarray, req: int, noise: float) -> None:
    """Add every row of ``seq`` to ``stats``: |Δ log p| over the whole vocabulary against ``reference``'s
    log-probabilities (same row indices), top-1 agreement with a tie of ``noise`` (llama.cpp's argmax agrees when
    the reference gives it a log-probability within ``noise`` of its maximum). -inf on both sides counts as equal."""
    reference = reference[seq.first_row :]
    n = min(len(seq.logits), len(reference))
    ours, ref = _log_softmax(seq.logits[:n]), reference[:n].astype(np.float64)
    both = np.isneginf(ours) & np.isneginf(ref)
    diff = np.where(both, 0.0, np.nan_to_num(np.abs(ours - ref), nan=np.inf))
    top = ours.argmax(axis=-1)
    mismatch = ref[np.arange(n), top] < ref.max(axis=-1) - noise
    worst = diff.max(axis=-1)
    stats.positions += n
    stats.compared += diff.size
    stats.sum_abs_dlogp += float(diff.sum())
    stats.max_abs_dlogp = max(stats.max_abs_dlogp, float(worst.max(initial=0.0)))
    stats.top1_disagreements += int(mismatch.sum())
    stats.per_request_max.append(float(worst.max(initial=0.0)))
    if stats.first is None:
        bad = np.flatnonzero((worst >= noise) | mismatch)
        if bad.size:
            t = int(bad[0]) + seq.first_row
            where, index = ("prompt", t + 1) if t + 1 < seq.prompt_len else ("step", t + 1 - seq.prompt_len)
            row = t - seq.first_row
            stats.first = Divergence(req, where, index, float(worst[row]), bool(mismatch[row]))


TOP_GAP = 5  # the gap statistic reads the reference's 5 most likely ids at each position: what sampling sees


def top_gap(seqs: Sequence[Rows], reference: Callable[[list[int]], np.ndarray], k: int = TOP_GAP) -> float:
    """Mean over positions of the mean |Δ log p| over the reference's top-``k`` ids (quantized files' gap statistic:
    the tokens generation picks from, not the vocabulary's far tail, where quantization moves log p the most; a
    mean, because a quantized engine's paths differ from each other position by position as much as from float32,
    so a maximum over positions measures that noise, not the phase)."""
    rows = []
    for seq in seqs:
        ref = reference(seq.ids)[seq.first_row :]
        n = min(len(seq.logits), len(ref))
        ours, theirs = _log_softmax(seq.logits[:n]), ref[:n].astype(np.float64)
        top = np.argsort(-theirs, axis=-1, kind="stable")[:, :k]
        diff = np.abs(np.take_along_axis(ours, top, -1) - np.take_along_axis(theirs, top, -1))
        rows.append(np.nan_to_num(diff, nan=np.inf).mean(axis=-1))
    return float(np.concatenate(rows).mean()) if rows else 0.0


def _stats(seqs: Sequence[Rows], reference: Callable[[list[int]], np.ndarray], noise: float) -> LogprobStats:
    stats = LogprobStats()
    for i, seq in enumerate(seqs):
        compare_rows(stats, seq, reference(seq.ids), i, noise)
    return stats


# ---- the phases --------------------------------------------------------------------------------------------------
@dataclass
class PhaseContext:
    """What every phase needs: the engine, both references, the thresholds, the label of the file's types."""

    model: LlamaCppModel
    reference: Callable[[list[int]], np.ndarray]  # float32 recomputation: log-probabilities (len(ids), vocab)
    thresholds: Thresholds
    label: str
    exact: bool
    steps: int
    reference_module: Any = None  # the float32 transformers module (the context-shift reference)

    def judge(
        self, stats: LogprobStats, own: LogprobStats | None, gap: float, baseline: float | None
    ) -> tuple[str, str, float | None]:
        """(verdict, judged_on, gap ratio) of a phase: verify-cache's scale on recomputation (and on llama.cpp's own
        prefill) when the arithmetic is exact; else ``gap`` (the phase's :func:`top_gap` to float32) over
        ``baseline`` (llama.cpp's own prefill of the same tokens, same statistic); no baseline: pass."""
        th = self.thresholds
        ref_verdict = serving_verdict(stats.max_abs_dlogp, stats.top1_disagreements, th)
        if self.exact:
            own_verdict = serving_verdict(own.max_abs_dlogp, own.top1_disagreements, th) if own else "pass"
            return worst_verdict([ref_verdict, own_verdict]), "reference", None
        if baseline is None:
            return "pass", "gap", None  # the prefill phase: the yardstick itself
        verdict, ratio = gap_verdict(gap, baseline, th.noise)  # the one rule of every reduced-precision deployment
        return verdict, "gap", ratio

    def own_prefill(self, ids: list[int]) -> np.ndarray:
        """llama.cpp's log-probabilities of ``ids`` from one fresh ``llama_decode`` call."""
        return _log_softmax(self.model.logits(ids))

    def report(self, phase: str, seqs: Sequence[Rows], with_self: bool = True, **extra: Any) -> LlamaCppPhaseReport:
        """Both comparisons of ``seqs`` and the verdict on the one that judges this file."""
        th = self.thresholds
        ref = _stats(seqs, self.reference, th.noise)
        own_lp = {tuple(q.ids): self.own_prefill(q.ids) for q in seqs} if with_self else {}
        own = _stats(seqs, lambda ids: own_lp[tuple(ids)], th.noise) if with_self else None
        gap = top_gap(seqs, self.reference)
        baseline = None
        if with_self:  # llama.cpp's own prefill of the same tokens: the quantization gap on exactly these positions
            own_rows = [Rows(q.ids, own_lp[tuple(q.ids)][q.first_row :], q.prompt_len, q.first_row) for q in seqs]
            baseline = top_gap(own_rows, self.reference)
        verdict, judged_on, ratio = self.judge(ref, own, gap, baseline)
        return LlamaCppPhaseReport(
            phase,
            self.label,
            len(seqs),
            ref.positions,
            ref.max_abs_dlogp,
            ref.mean_abs_dlogp,
            ref.top1_agreement,
            ref.top1_disagreements,
            json_safe(ref.first) if ref.first else None,
            verdict,
            self_max_abs_dlogp=own.max_abs_dlogp if own else None,
            self_top1_agreement=own.top1_agreement if own else None,
            self_first_divergence=json_safe(own.first) if own and own.first else None,
            judged_on=judged_on,
            gap_top5=gap,
            gap_ratio=ratio,
            reference_verdict=serving_verdict(ref.max_abs_dlogp, ref.top1_disagreements, th),
            **extra,
        )


def prefill_phase(pc: PhaseContext, work: Workload) -> LlamaCppPhaseReport:
    """Each prompt in one ``llama_decode`` call; only the recomputation comparison (it IS llama.cpp's prefill)."""
    seqs = [Rows(list(p), pc.model.logits(p), len(p)) for p in work.alone]
    return pc.report("prefill", seqs, with_self=False)


def decode_phase(pc: PhaseContext, work: Workload) -> LlamaCppPhaseReport:
    """Prompt prefilled, then ``steps`` greedy tokens, one ``llama_decode`` call each, all rows kept."""
    m, pick = pc.model, greedy_picker()
    seqs = []
    for p in work.alone:
        m.reset()
        ids = list(p)
        rows = [m.decode(ids, 0, logits="all")]
        for _ in range(pc.steps):
            ids.append(pick(rows[-1][-1], ids))
            rows.append(m.decode([ids[-1]], len(ids) - 1, logits="all"))
        seqs.append(Rows(ids, np.concatenate(rows), len(p)))
    return pc.report("decode", seqs)


def batch_phase(pc: PhaseContext, work: Workload) -> LlamaCppPhaseReport:
    """Mixed-length prompts as separate sequences of one context (one prefill call, one call per step)."""
    out = pc.model.generate_batch(work.batch, pc.steps, greedy_picker(), keep_logits=True)
    seqs = [Rows(g.prompt + g.tokens, g.logits, len(g.prompt)) for g in out]
    note = f"{len(seqs)} sequences (seq_id 0..{len(seqs) - 1}) in one context with a unified KV cache"
    return pc.report("batch", seqs, note=note)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def prompt_cache_phase(pc: PhaseContext, first: list[int], second: list[int], phase: str) -> LlamaCppPhaseReport:
    """``first`` then ``second`` through the ``Llama`` object's prompt cache; the second's rows compared, and the
    tokens it was served from the cache checked against the prefix the two prompts actually share."""
    m = pc.model
    m.reset()
    m.cached_prompt_logits(first)
    rows, cached = m.cached_prompt_logits(second)
    shared = common_prefix(first, second)
    rep = pc.report(phase, [Rows(second, rows, len(second))], cached_tokens=cached, shared_tokens=shared)
    wrong = reuse_check(cached, shared, 1)
    if wrong:
        rep.verdict, rep.note = "bug", f"{wrong}: the cache was reused for a different prompt"
    elif cached == 0:
        rep.note = "nothing was served from the prompt cache (the engine re-evaluated the whole prompt)"
    return rep


def shifted_cache_logprobs(module: Any, fill: list[int], n_keep: int, n_discard: int, steps: list[int]) -> np.ndarray:
    """float32 log-probabilities of ``steps`` decoded after llama.cpp's context shift, computed with ``transformers``:
    ``fill`` prefilled into a ``DynamicCache``; the entries of positions ``[n_keep, n_keep + n_discard)`` dropped;
    the later keys rotated back by ``n_discard`` positions (RoPE composes: R(p − d) = R(−d) R(p)), values kept
    as computed; then ``steps`` decoded at positions ``len(kept), ...``. Row s predicts ``steps[s + 1]``.

    This, not recomputation of the kept tokens, is what a context shift computes: a kept token's cached K/V in
    layers above the first were computed while it attended to the tokens now discarded, and the shift does not
    recompute them (``llama_kv_cache::build_graph_shift`` only re-rotates K)."""
    from transformers import DynamicCache

    rotary = getattr(getattr(module, "model", None), "rotary_emb", None)
    if rotary is None or getattr(rotary, "rope_type", "default") != "default":
        raise ValueError("the context-shift reference needs a transformers model with plain RoPE (rope_type default)")
    with torch.inference_mode():
        x = torch.tensor([fill], dtype=torch.long)
        cache = module(input_ids=x, use_cache=True).past_key_values
        shifted = DynamicCache()
        for i, layer in enumerate(cache.layers):
            k, v = layer.keys, layer.values
            tail = k[:, :, n_keep + n_discard :]
            pos = torch.full((1, tail.shape[2]), -n_discard, dtype=torch.long)
            cos, sin = rotary(tail, pos)
            rot = torch.cat((-tail[..., tail.shape[-1] // 2 :], tail[..., : tail.shape[-1] // 2]), dim=-1)
            tail = tail * cos.unsqueeze(1) + rot * sin.unsqueeze(1)
            keys = torch.cat([k[:, :, :n_keep], tail], dim=2)
            values = torch.cat([v[:, :, :n_keep], v[:, :, n_keep + n_discard :]], dim=2)
            shifted.update(keys, values, i)
        kept = keys.shape[2]
        ids = torch.tensor([steps], dtype=torch.long)
        positions = torch.arange(kept, kept + len(steps)).unsqueeze(0)
        mask = torch.ones(1, kept + len(steps), dtype=torch.long)
        out = module(input_ids=ids, position_ids=positions, attention_mask=mask, past_key_values=shifted)
        return torch.log_softmax(out.logits[0].float(), dim=-1).double().numpy()


def context_shift_phase(pc: PhaseContext, fill: list[int], n_keep: int) -> LlamaCppPhaseReport:
    """The context filled with ``fill``, then llama.cpp's context shift (``tools/completion/completion.cpp``:
    ``n_discard = (n_past - n_keep) / 2``; ``llama_memory_seq_rm(n_keep, n_keep + n_discard)``;
    ``llama_memory_seq_add(n_keep + n_discard, n_past, -n_discard)``) and ``steps`` greedy tokens. The reference is
    :func:`shifted_cache_logprobs` (the same shift done in float32); "self" is llama.cpp's own prefill of the kept
    tokens, i.e. full recomputation, which a shift does not do: that distance is reported, never judged."""
    m, pick = pc.model, greedy_picker()
    if not 0 <= n_keep < len(fill) - 1:
        raise ValueError(f"n_keep must be in [0, {len(fill) - 1}) for a fill of {len(fill)} tokens, got {n_keep}")
    m.reset()
    n_past = len(fill)
    last = m.decode(fill, 0, logits="last")[0]
    n_discard = (n_past - n_keep) // 2
    m.remove(n_keep, n_keep + n_discard)
    m.shift(n_keep + n_discard, n_past, -n_discard)
    ids = fill[:n_keep] + fill[n_keep + n_discard :]
    kept = len(ids)
    rows = []
    for _ in range(pc.steps):
        ids.append(pick(last, ids))
        last = m.decode([ids[-1]], len(ids) - 1, logits="last")[0]
        rows.append(last)
    seq = Rows(ids, np.stack(rows), kept)
    shifted = shifted_cache_logprobs(pc.reference_module, fill, n_keep, n_discard, ids[kept:])
    stats = LogprobStats()
    compare_rows(stats, seq, shifted, 0, pc.thresholds.noise)
    own = LogprobStats()
    own_lp = pc.own_prefill(ids)  # full recomputation in llama.cpp: the quantization gap of these tokens unshifted
    compare_rows(own, Rows(ids, seq.logits, kept, first_row=kept), own_lp, 0, pc.thresholds.noise)
    baseline = top_gap([Rows(ids, own_lp[kept:], kept, first_row=kept)], pc.reference)
    th = pc.thresholds
    gap = top_gap([seq], lambda _ids: shifted)
    verdict, judged_on, ratio = pc.judge(stats, None, gap, baseline)
    note = (
        f"filled {n_past} positions, kept {n_keep}, discarded {n_discard}, then {pc.steps} greedy steps; reference: "
        f"the float32 cache shifted the same way; 'self' = full recomputation of the kept tokens (not what a shift "
        f"computes: the kept tokens' K/V still hold the discarded context)"
    )
    return LlamaCppPhaseReport(
        "context_shift",
        pc.label,
        1,
        stats.positions,
        stats.max_abs_dlogp,
        stats.mean_abs_dlogp,
        stats.top1_agreement,
        stats.top1_disagreements,
        json_safe(stats.first) if stats.first else None,
        verdict,
        note=note,
        self_max_abs_dlogp=own.max_abs_dlogp,
        self_top1_agreement=own.top1_agreement,
        self_first_divergence=json_safe(own.first) if own.first else None,
        judged_on=judged_on,
        gap_top5=gap,
        gap_ratio=ratio,
        reference_verdict=serving_verdict(stats.max_abs_dlogp, stats.top1_disagreements, th),
    )


# ---- the whole check ---------------------------------------------------------------------------------------------
def file_label(types: dict[str, int], kv_type: str) -> tuple[str, bool]:
    """``("Q4_K/kv-f16", False)``: the file's main tensor type (the most common one other than F32, which norms
    keep in every file) with the KV-cache type, and whether llama.cpp's arithmetic on it is exact float32."""
    main = next((t for t in types if t != "F32"), "F32")
    exact = set(types) <= EXACT_TYPES and kv_type == "f32"
    return f"{main}/kv-{kv_type}", exact


def run_llamacpp_phases(
    pc: PhaseContext, work: Workload, fill: list[int], n_keep: int, log: Callable[[str], None]
) -> list[LlamaCppPhaseReport]:
    """Every phase on one engine, in :data:`PHASES` order."""
    first, second = work.prefix_first, work.prefix_second
    diverging = diverging_request(first, len(first) // 2, pc.model.vocab_size)
    steps: list[tuple[str, Callable[[], LlamaCppPhaseReport]]] = [
        ("prefill", lambda: prefill_phase(pc, work)),
        ("decode", lambda: decode_phase(pc, work)),
        ("batch", lambda: batch_phase(pc, work)),
        ("prompt_cache", lambda: prompt_cache_phase(pc, first, second, "prompt_cache")),
        ("prompt_cache_diverge", lambda: prompt_cache_phase(pc, first, diverging, "prompt_cache_diverge")),
        ("context_shift", lambda: context_shift_phase(pc, fill, n_keep)),
    ]
    reports = []
    for name, phase in steps:
        log(f"llama.cpp phase {name} …")
        try:
            reports.append(phase())
        except LlamaCppDecodeError as exc:  # the engine refused its own workload: a failure of this phase
            reports.append(LlamaCppPhaseReport(name, pc.label, verdict="bug", note=f"llama.cpp failed: {exc}"))
    return reports


def verify_serving_llamacpp(
    model: str | os.PathLike[str],
    reference: str | os.PathLike[str] | None = None,
    *,
    engine: LlamaCppModel | None = None,
    n_ctx: int = 256,
    n_threads: int = 1,
    kv_type: str = "f16",
    prompts: Sequence[Sequence[int]] = (),
    steps: int = 16,
    n_keep: int = 4,
    thresholds: Thresholds | None = None,
    seed: int = 0,
    log: Callable[[str], None] | None = None,
) -> ServingReport:
    """Every phase of :data:`PHASES` on the GGUF file ``model`` served by llama.cpp, each position compared with
    float32 recomputation of ``reference`` (default: the file itself, dequantized by ``genprobe.load``) and with
    llama.cpp's own prefill. ``engine`` is an already opened :class:`LlamaCppModel` of ``model`` (tests pass a
    planted fault); else one is opened with ``n_ctx`` / ``n_threads`` / ``kv_type`` and closed at the end.
    ``prompts`` (token ids) replace the seeded random ids; ``n_keep`` tokens survive the context shift."""
    from ...model.load import load_model

    say = log or (lambda msg: None)
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    th = thresholds or Thresholds()
    ref_model = load_model(reference if reference is not None else model)
    opened = engine is None
    m = engine if engine is not None else LlamaCppModel(model, n_ctx=n_ctx, n_threads=n_threads, kv_type=kv_type)
    try:
        _check_sizes(m, ref_model.vocab_size, steps, n_keep)
        ref = ReferenceLogprobs(ref_model)
        types = model_file_types(m.path)
        label, exact = file_label(types, m.settings.kv_type)
        say(f"llama.cpp on {m.path.name}: {label} ({'exact float32' if exact else 'quantized arithmetic'})")
        pc = PhaseContext(m, lambda ids: ref(ids).numpy(), th, label, exact, steps, ref_model.module)
        work = build_workload(m.n_ctx - steps, m.n_ctx, m.vocab_size, prompts, seed)
        fill = build_workload(m.n_ctx, m.n_ctx, m.vocab_size, prompts, seed + 1).prefix_first[: m.n_ctx]
        report = ServingReport(
            str(model), str(reference if reference is not None else model), [], th, steps, m.vocab_size
        )
        report.engines.append({**m.describe(), "exact_arithmetic": exact})
        report.phases += run_llamacpp_phases(pc, work, fill, n_keep, say)
    finally:
        if opened:
            m.close()
    return report


def _check_sizes(m: LlamaCppModel, ref_vocab: int, steps: int, n_keep: int) -> None:
    if ref_vocab != m.vocab_size:
        raise ValueError(f"the reference has {ref_vocab} output ids but the GGUF file has {m.vocab_size}")
    room = (m.n_ctx - n_keep) // 2
    if steps > room:
        raise ValueError(
            f"{steps} steps do not fit after the context shift (n_ctx {m.n_ctx}, n_keep {n_keep}: {room} positions "
            "are freed): lower the steps or raise n_ctx"
        )
    if m.n_ctx - steps < 4:
        raise ValueError(f"n_ctx {m.n_ctx} leaves no room for prompts with {steps} steps")


# ---- a planted fault ---------------------------------------------------------------------------------------------
class StalePromptCacheModel(LlamaCppModel):
    """Planted fault: a prompt cache that trusts what it holds. Before each call it marks every cached token as
    matching the new prompt (as a cache keyed on length, or on a hash of only part of the prompt, would), so
    ``Llama.generate`` reuses the previous prompt's KV entries for a different prompt. verify-serving's prompt-cache
    phases must call this a bug (``tests/serving/llamacpp/test_verify_serving.py``)."""

    def cached_prompt_logits(self, prompt_ids: Sequence[int]) -> tuple[np.ndarray, int]:
        """The fault, then the real call."""
        n = min(int(self.llama.n_tokens), len(prompt_ids))
        self.llama.input_ids[:n] = np.asarray(prompt_ids[:n], dtype=self.llama.input_ids.dtype)
        return super().cached_prompt_logits(prompt_ids)


__all__ = [
    "PHASES",
    "LlamaCppPhaseReport",
    "StalePromptCacheModel",
    "compare_rows",
    "file_label",
    "verify_serving_llamacpp",
]
