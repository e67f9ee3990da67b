"""verify-serving through llama.cpp: the one verifier (:mod:`genprobe.serving.verify`) on
:class:`~genprobe.serving.llamacpp.engine.LlamaCppBackend`, plus the one phase that exists only here.

Every position's whole distribution is compared with float32 recomputation of the same weights (``genprobe.load``
of the file, or ``reference=`` a float directory) and with llama.cpp's own one-call prefill of the same tokens
("self", the floor of a quantized file: :mod:`genprobe.serving.judge`). Only an F32 file with an F32 KV cache is
judged on the absolute scale; anything else on its gap ratio (docs/llamacpp.md: why, with measurements).

``context_shift`` (:func:`context_shift_phase`) is judged against the float32 cache shifted the same way.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from functools import partial
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ...verify.compare import Thresholds
from ..judge import Judge, PhaseReport, reference_logprobs
from ..verify import Run, ServingReport, Settings, build_workload
from .engine import Generation, LlamaCppBackend, LlamaCppDecodeError, LlamaCppModel, greedy_picker


def shifted_cache_logprobs(module: Any, fill: list[int], n_keep: int, n_discard: int, steps: list[int]) -> np.ndarray:
    """float32 log-probabilities of ``steps`` decoded after llama.cpp's context shift, computed with ``transformers``:
    ``fill`` prefilled into a ``DynamicCache``; the entries of positions ``[n_keep, n_keep + n_discard)`` dropped;
    the later keys rotated back by ``n_discard`` positions (RoPE composes: R(p − d) = R(−d) R(p)), values kept
    as computed; then ``steps`` decoded at positions ``len(kept), ...``. Row s predicts ``steps[s + 1]``. This, not
    recomputation, is what a shift computes: the kept K/V still hold the discarded context (docs/llamacpp.md)."""
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


def context_shift_phase(run: Run, fill: list[int], n_keep: int, module: Any) -> PhaseReport:
    """The context filled with ``fill``, then llama.cpp's context shift (``n_discard = (n_past - n_keep) / 2``;
    ``llama_memory_seq_rm(n_keep, n_keep + n_discard)``; ``llama_memory_seq_add(n_keep + n_discard, n_past,
    -n_discard)``) and ``steps`` greedy tokens. The reference is :func:`shifted_cache_logprobs` (the same shift done
    in float32); "self" is llama.cpp's own prefill of the kept tokens, i.e. full recomputation, which a shift does
    not do: that distance is reported, never judged."""
    assert isinstance(run.backend, LlamaCppBackend)
    m, steps = run.backend.model, run.settings.steps
    if not 0 <= n_keep < len(fill) - 1:
        raise ValueError(f"n_keep must be in [0, {len(fill) - 1}) for a fill of {len(fill)} tokens, got {n_keep}")
    n_discard = (len(fill) - n_keep) // 2
    kept = fill[:n_keep] + fill[n_keep + n_discard :]
    try:
        m.reset()
        last = m.decode(fill, 0, logits="last")
        m.remove(n_keep, n_keep + n_discard)
        m.shift(n_keep + n_discard, len(fill), -n_discard)
        # one token more than compared, so that the last compared one is decoded too: rows[t + 1] (after the shift)
        # predicts the token after step t; the kept prompt's rows were computed before the shift
        g = m.extend(kept, last, steps + 1, greedy_picker())
    except LlamaCppDecodeError as exc:  # the engine refused its own workload: a failure of this phase
        return PhaseReport("context_shift", verdict="bug", note=f"llama.cpp failed: {exc}")
    response = run.backend.response(Generation(kept, g.tokens[:steps], g.logits[1:]), at=len(kept))
    shifted = torch.from_numpy(shifted_cache_logprobs(module, fill, n_keep, n_discard, response.token_ids))
    padded = torch.cat([torch.zeros(len(kept), shifted.shape[1], dtype=shifted.dtype), shifted])
    note = (
        f"filled {len(fill)} positions, kept {n_keep}, discarded {n_discard}, then {steps} greedy steps; reference: "
        "the float32 cache shifted the same way; 'self' = full recomputation of the kept tokens (not what a shift "
        "computes: the kept tokens' K/V still hold the discarded context)"
    )
    return run.judge.phase("context_shift", [response], reference=lambda _: padded, judge_self=False, note=note)


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
    """Every phase on the GGUF file ``model`` served by llama.cpp, each position compared with float32 recomputation
    of ``reference`` (default: the file itself, dequantized by ``genprobe.load``) and with llama.cpp's own prefill.
    ``engine`` is an already opened :class:`LlamaCppModel` of ``model`` (tests pass a planted fault); else one is
    opened with ``n_ctx`` / ``n_threads`` / ``kv_type`` and closed at the end. ``prompts`` (token ids) replace the
    seeded random ids; ``n_keep`` tokens survive the context shift."""
    from ...model.gguf import inspect_gguf
    from ...model.load import load_model

    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    th = thresholds or Thresholds()
    ref_model = load_model(reference if reference is not None else model)
    m = engine if engine is not None else LlamaCppModel(model, n_ctx=n_ctx, n_threads=n_threads, kv_type=kv_type)
    try:
        if ref_model.vocab_size != m.vocab_size:
            raise ValueError(f"the reference has {ref_model.vocab_size} output ids but the GGUF file {m.vocab_size}")
        if steps > (room := (m.n_ctx - n_keep) // 2):
            raise ValueError(
                f"{steps} steps do not fit after the context shift (n_ctx {m.n_ctx}, n_keep {n_keep}: {room} "
                "positions are freed): lower the steps or raise n_ctx"
            )
        types, kv = inspect_gguf(m.path).type_counts, m.kv_type
        # "Q4_K/kv-f16": the most common tensor type but F32 (which norms keep in every file) and the KV-cache type;
        # exact float32 arithmetic only with F32 tensors alone (no activation quantization) and an F32 KV cache
        label = f"{next((t for t in types if t != 'F32'), 'F32')}/kv-{kv}"
        exact = set(types) == {"F32"} and kv == "f32"
        (log or (lambda _: None))(f"llama.cpp on {m.path.name}: {label} ({'exact float32' if exact else 'quantized'})")
        backend = LlamaCppBackend(m, label, exact)
        settings = Settings(concurrency=8, steps=steps, seed=seed)
        judge = Judge(reference_logprobs(ref_model), th, settings.top_k, backend.own_prefill, exact)
        work = build_workload(m.n_ctx - steps, m.n_ctx, m.vocab_size, prompts, seed)
        fill = [int(t) for t in build_workload(m.n_ctx, m.n_ctx, m.vocab_size, prompts, seed + 1).prefix[0][: m.n_ctx]]
        shift = partial(context_shift_phase, fill=fill, n_keep=n_keep, module=ref_model.module)
        report = ServingReport(str(model), str(reference if reference is not None else model), th, asdict(settings))
        report.add(Run(backend, judge, work, settings, ref_model), {**m.describe(), "exact_arithmetic": exact}, [shift])
    finally:
        if engine is None:
            m.close()
    return report
