"""Loop scan through llama.cpp: the same prompts, samplers and records as :func:`genprobe.loops.scan.scan_loops`.

Generation runs in llama.cpp (:meth:`~genprobe.serving.llamacpp.engine.LlamaCppModel.generate_batch`: up to
``batch_size`` prompts as sequences of one context, one ``llama_decode`` call per step), and every token is chosen by
llama.cpp's own sampler chain built from the setting's :class:`~genprobe.engine.samplers.SamplerConfig`
(:class:`~genprobe.serving.llamacpp.sampling.LlamaCppSampler`, one per prompt, seeded ``seed + i``; it accepts the
prompt's tokens first, as ``llama-server`` does). A setting llama.cpp cannot express exactly is refused before
anything runs (:class:`~genprobe.serving.llamacpp.sampling.UnsupportedLlamaCppSamplerError`). Loop measures are
genprobe's own on the returned ids, and the result is the same :class:`~genprobe.loops.scan.ScanResult` as our
engine's scan. Greedy settings (greedy after bans) give our engine's tokens on an F32 file up to float ties (tested:
per-prompt verdicts equal); sampled settings draw with llama.cpp's RNG (``std::mt19937``), so they agree in
distribution, not token by token.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from typing_extensions import Unpack

from ...engine.samplers import SamplerConfig
from ...loops.scan import ScanOptions, ScanResult, chanting_sampler, scan_batches, study_sampler
from .engine import LlamaCppModel, NextToken
from .sampling import LlamaCppSampler, LlamaVocab, UnsupportedLlamaCppSamplerError, chain_stages

GGUF_HINT = "give MODEL as the GGUF file llama.cpp should run (e.g. ~/.cache/genprobe/models/<name>.gguf)"


def chain_picker(sampler: LlamaCppSampler) -> NextToken:
    """``next_token`` for one sequence: the chain accepts every token of the history it has not seen yet (the prompt
    on the first call, then each generated token), then samples the row."""
    seen = [0]

    def pick(row: np.ndarray, history: list[int]) -> int:
        for t in history[seen[0] :]:
            sampler.accept(t)
        seen[0] = len(history)
        return sampler.sample(row)

    return pick


def check_sampler_llamacpp(sampler: SamplerConfig, context_length: int, eos_id: int | None = None) -> None:
    """Raise :class:`UnsupportedLlamaCppSamplerError` now (before llama.cpp starts) when its sampler chain cannot
    express ``sampler`` exactly (with the end-token ban a scan adds)."""
    chain_stages(study_sampler(sampler, eos_id), context_length=context_length)


def scan_loops_llamacpp(
    model: LlamaCppModel,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    sampler: SamplerConfig | None = None,
    *,
    dry_breaker_strings: Sequence[str] = (),
    **options: Unpack[ScanOptions],
) -> ScanResult:
    """:func:`genprobe.loops.scan.scan_loops` with generation and sampling in llama.cpp (``batch_size`` prompts per
    context; prompt ``i`` sampled with seed ``seed + i``). Same arguments and result
    (:func:`genprobe.loops.scan.scan_batches`); ``eos_id`` is banned, never a stop (fixed-length loop studies),
    exactly as in our engine's scan. ``dry_breaker_strings``: DRY's sequence breakers as strings (llama.cpp
    tokenizes them)."""
    _check_prompts(model, prompts, max_new_tokens)
    # refused before llama.cpp generates anything (the chain cannot express it exactly)
    check_sampler_llamacpp(sampler or chanting_sampler(options.get("unk_id", 1)), model.n_ctx, options.get("eos_id"))
    seed = options.get("seed", 0)
    vocabs: dict[str, LlamaVocab] = {}

    def generate_batch(chunk: list[list[int]], sampler: SamplerConfig, start: int, _: int) -> list[tuple]:
        if sampler.dry_active and "vocab" not in vocabs:
            vocabs["vocab"] = LlamaVocab(model.path)
        chains = [
            LlamaCppSampler(
                sampler,
                n_vocab=model.vocab_size,
                context_length=model.n_ctx,
                vocab=vocabs.get("vocab"),
                dry_breaker_strings=dry_breaker_strings,
                seed=seed + start + j,
            )
            for j in range(len(chunk))
        ]
        try:
            outs = model.generate_batch(chunk, max_new_tokens, [chain_picker(c) for c in chains])
        finally:
            for c in chains:
                c.close()
        return [(out.tokens, len(out.tokens) == max_new_tokens) for out in outs]

    try:
        return scan_batches(generate_batch, prompts, max_new_tokens, sampler, **options)
    finally:
        for vocab in vocabs.values():
            vocab.close()


def _check_prompts(model: LlamaCppModel, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> None:
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty: every prompt needs at least one token")
        if min(p) < 0 or max(p) >= model.vocab_size:
            raise ValueError(f"prompt {i} holds a token id outside [0, {model.vocab_size})")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")


def gguf_file_for(model_arg: str | os.PathLike[str]) -> Path:
    """The GGUF file a ``--backend llama.cpp`` MODEL names: a ``.gguf`` file, a directory holding exactly one, or a
    catalog name whose GGUF ``genprobe fetch`` kept (``smollm2``); else an error saying what to give."""
    from ...model.catalog import CATALOG
    from ...model.gguf import gguf_file_of, is_gguf_path

    path = Path(model_arg).expanduser()
    if path.exists() and is_gguf_path(path):
        return gguf_file_of(path)
    entry = CATALOG.get(str(model_arg))
    if entry is not None and entry.gguf_path().is_file():
        return entry.gguf_path()
    raise ValueError(f"llama.cpp runs GGUF files and {model_arg} is not one: {GGUF_HINT}")


def llamacpp_scan_backend(
    gguf: str | os.PathLike[str], *, n_threads: int = 1, kv_type: str = "f16", dry_breaker_strings: Sequence[str] = ()
) -> Callable[..., tuple[Callable[..., Any], dict[str, Any]]]:
    """The llama.cpp backend of :func:`genprobe.loops.scan_settings.scan_loop_settings` (``backend=``) for the GGUF
    file ``gguf``: every setting checked before llama.cpp loads (one its sampler chain cannot express raises
    :class:`UnsupportedLlamaCppSamplerError`, never approximated), a context sized to the longest prompt plus the
    new tokens, and each scan run by :func:`scan_loops_llamacpp` with the study's budget, batch, seed, bans and
    detector settings. The genprobe model passed in (``genprobe.load`` of the same file) supplies the tokenizer;
    its vocabulary must be the file's."""

    def backend(
        model: Any,
        study: Any,
        samplers: dict[str, SamplerConfig],
        ids: Sequence[Sequence[int]],
        log: Callable[[str], None],
    ) -> tuple[Callable[..., Any], dict[str, Any]]:
        n_ctx = max(len(p) for p in ids) + study.cfg.max_new_tokens
        for name, sampler in samplers.items():
            try:
                check_sampler_llamacpp(sampler, n_ctx, model.eos_id)
            except UnsupportedLlamaCppSamplerError as exc:
                msg = f"llama.cpp cannot run the {name!r} setting exactly: {exc}"
                raise UnsupportedLlamaCppSamplerError(msg) from None
        engine = LlamaCppModel(gguf, n_ctx=n_ctx, n_threads=n_threads, kv_type=kv_type)
        if engine.vocab_size != model.vocab_size:
            engine.close()
            raise ValueError(f"{gguf} has {engine.vocab_size} token ids but the loaded model {model.vocab_size}")
        log(f"llama.cpp engine ready ({Path(gguf).name}, n_ctx {engine.n_ctx}, {n_threads} thread(s))")
        cfg = study.cfg

        def scan(ids: Any, texts: Any, *, sampler: Any, desc: str) -> Any:
            options = study.scan_options(texts, desc)
            return scan_loops_llamacpp(
                engine, ids, cfg.max_new_tokens, sampler, dry_breaker_strings=dry_breaker_strings, **options
            )

        return scan, {"backend": "llama.cpp", "llama.cpp": engine.describe()}

    return backend
