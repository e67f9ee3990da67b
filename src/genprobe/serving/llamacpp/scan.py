"""Loop scan through llama.cpp: the same prompts, samplers and records as genprobe's own engine scan.

Up to ``batch_size`` prompts run as sequences of one context (:meth:`LlamaCppModel.generate_batch`), every token
chosen by llama.cpp's own sampler chain (:class:`~genprobe.serving.llamacpp.sampling.LlamaCppSampler`, one per
prompt, seeded ``seed + i``, the prompt accepted first as ``llama-server`` does); a setting the chain cannot express
is refused before it runs. An in-process fast path beside the Backend route, whose requests cannot carry DRY, XTC,
mirostat or penalties. Greedy settings give our engine's tokens on an F32 file up to float ties (tested); sampled
ones agree in distribution, not token by token.
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any, Sequence

from ...engine.samplers.stages import DRY, SamplerConfig
from ...loops.scan import Batch, GenerateBatch, ScanEngine, ScanOptions, check_prompts
from .engine import LlamaCppModel
from .sampling import LlamaCppSampler, LlamaVocab, chain_stages

GGUF_HINT = "give MODEL as the GGUF file llama.cpp should run (e.g. ~/.cache/genprobe/models/<name>.gguf)"


def llamacpp_batches(model: LlamaCppModel, dry_breaker_strings: Sequence[str] = ()) -> GenerateBatch:
    """The scan's batch generator in llama.cpp (for :func:`genprobe.loops.scan.scan_batches`; module doc); DRY's
    breakers as strings (llama.cpp tokenizes them with the file's vocabulary)."""

    def generate_batch(b: Batch) -> list[tuple]:
        check_prompts(b, model.vocab_size)
        with ExitStack() as owned:  # the vocabulary and the chains freed however the batch ends
            vocab = owned.enter_context(LlamaVocab(model.path)) if DRY.active(b.sampler) else None
            sampler = partial(LlamaCppSampler, b.sampler, n_vocab=model.vocab_size, context_length=model.n_ctx)
            seeds = range(b.options.seed + b.first, b.options.seed + b.first + len(b.prompts))
            chains = [
                owned.enter_context(sampler(vocab=vocab, dry_breaker_strings=dry_breaker_strings, seed=s))
                for s in seeds
            ]
            outs = model.generate_batch(b.prompts, b.options.max_new_tokens, [c.pick for c in chains])
        return [(out.tokens, len(out.tokens) == b.options.max_new_tokens) for out in outs]

    return generate_batch


def gguf_file_for(model_arg: str | os.PathLike[str]) -> Path:
    """The GGUF file a ``--backend llama.cpp`` MODEL names: a ``.gguf`` file, a directory holding exactly one, or a
    catalog name whose GGUF ``genprobe fetch`` kept (``smollm2``); else an error saying what to give."""
    from ...model.catalog import CATALOG
    from ...model.gguf import gguf_file_of
    from ...model.kinds import ModelKind, model_kind

    path = Path(model_arg).expanduser()
    if model_kind(path) is ModelKind.GGUF:
        return gguf_file_of(path)
    entry = CATALOG.get(str(model_arg))
    if entry is not None and entry.gguf_path().is_file():
        return entry.gguf_path()
    raise ValueError(f"llama.cpp runs GGUF files and {model_arg} is not one: {GGUF_HINT}")


def llamacpp_scan_backend(
    gguf: str | os.PathLike[str], *, n_threads: int = 1, kv_type: str = "f16", dry_breaker_strings: Sequence[str] = ()
) -> ScanEngine:
    """llama.cpp as the engine of :func:`genprobe.loops.scan.scan_loop_settings` (``backend=``) on the GGUF
    file ``gguf``, its context sized to the longest prompt plus the new tokens. The genprobe model passed in
    (``genprobe.load`` of the same file) supplies the tokenizer; its vocabulary must be the file's."""

    def check(sampler: SamplerConfig, model: Any, n_ctx: int) -> None:
        chain_stages(sampler, context_length=n_ctx)

    def start(model: Any, scan: ScanOptions, ids: Sequence[Sequence[int]], log: Any) -> tuple[GenerateBatch, dict]:
        n_ctx = max(len(p) for p in ids) + scan.max_new_tokens
        engine = LlamaCppModel(gguf, n_ctx=n_ctx, n_threads=n_threads, kv_type=kv_type)
        if engine.vocab_size != model.vocab_size:
            engine.close()
            raise ValueError(f"{gguf} has {engine.vocab_size} token ids but the loaded model {model.vocab_size}")
        log(f"llama.cpp engine ready ({Path(gguf).name}, n_ctx {engine.n_ctx}, {n_threads} thread(s))")
        return llamacpp_batches(engine, dry_breaker_strings), {"backend": "llama.cpp", "llama.cpp": engine.describe()}

    return ScanEngine("llama.cpp", check, start)
