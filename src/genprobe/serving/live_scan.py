"""``genprobe loops scan URL``: the loop scan of :func:`genprobe.loops.scan.scan_batches` on what a live server (any
:class:`~genprobe.engine.backend.Backend`) generates — the endpoint is one more batch generator, not another scan.

The sampler is passed through to the server as the OpenAI API spells it (temperature, top_p, top_k, a seed per prompt,
banned ids as ``logit_bias`` -100), so the scan measures the deployment's own sampling; a setting the API cannot
express (min-p, typical-p, penalties, DRY, XTC, …) is refused, never approximated. Each batch of prompts is sent
with ``concurrency`` requests in flight, as users load the server."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Callable, Sequence

from ..engine.backend import Backend, Request, Sampler
from ..engine.samplers import SamplerConfig
from ..loops.scan import scan_batches

#: SamplerConfig fields an OpenAI-compatible request carries (the rest must stay at their defaults)
PASSED = {"greedy", "temperature", "top_k", "top_p", "ban_ids", "order", "engine"}


def backend_sampler(sampler: SamplerConfig, seed: int) -> Sampler:
    """``sampler`` as the API's settings; a ``ValueError`` naming the first setting the API cannot express."""
    for f in fields(SamplerConfig):
        if f.name not in PASSED and getattr(sampler, f.name) != f.default:
            raise ValueError(
                f"an OpenAI-compatible server takes temperature, top-p, top-k and banned ids; not {f.name}"
            )
    if sampler.greedy:
        return Sampler(0.0, ban_ids=tuple(sampler.ban_ids))
    return Sampler(sampler.temperature, sampler.top_p or 1.0, sampler.top_k or 0, seed, tuple(sampler.ban_ids))


def endpoint_scan_backend(backend: Backend, concurrency: int) -> Callable[..., tuple[Callable[..., Any], dict]]:
    """The backend of :func:`genprobe.loops.scan_settings.scan_loop_settings` (``backend=``) for a live server."""

    def make(model: Any, study: Any, samplers: dict[str, SamplerConfig], ids: Any, log: Callable[[str], None]):
        for sampler in samplers.values():
            backend_sampler(sampler, 0)  # refused before any request is sent
        cfg = study.cfg

        def scan(ids: Sequence[Sequence[int]], texts: Sequence[str] | None, *, sampler: SamplerConfig, desc: str):
            def generate_batch(chunk: list[list[int]], s: SamplerConfig, start: int, _: int) -> list[tuple]:
                prompts = _prompts(backend, chunk, texts, start)
                reqs = [
                    Request(p, cfg.max_new_tokens, backend_sampler(s, cfg.seed + start + i), logprobs=1)
                    for i, p in enumerate(prompts)
                ]
                outs = backend.complete_many(reqs, concurrency)
                return [(o.token_ids, len(o.token_ids) == cfg.max_new_tokens) for o in outs]

            return scan_batches(generate_batch, ids, cfg.max_new_tokens, sampler, **study.scan_options(texts, desc))

        caps = backend.capabilities
        return scan, {"backend": "endpoint", "server": caps.server, "model": backend.model_name}

    return make


def _prompts(backend: Backend, chunk: list[list[int]], texts: Sequence[str] | None, start: int) -> list:
    if backend.capabilities.token_prompts:
        return [tuple(p) for p in chunk]
    if texts is None:
        raise ValueError(f"the {backend.capabilities.server} server takes text prompts: give the prompts as text")
    return list(texts[start : start + len(chunk)])
