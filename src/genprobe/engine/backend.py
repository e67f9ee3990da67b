"""One protocol for everything that produces tokens and log-probabilities (issue #45): genprobe's engine, and — in
``genprobe.serving.endpoint`` — a live OpenAI-compatible server. A job (the live verifier, a loop scan) is written
once against :class:`Backend`; each backend says what it can do in :class:`Capabilities` and the job checks what
that allows and says what it could not check.

The request/response types are plain dataclasses of JSON-able fields (``dataclasses.asdict`` serialises them); a
request's sampler is the :class:`~genprobe.engine.samplers.stages.SamplerConfig` the engine itself samples with,
limited to what the OpenAI API carries (:data:`API_FIELDS`).
Log-probabilities are natural logs; ``Position.top`` holds the ``k`` most likely ids at a position (the whole
vocabulary is never shipped: an engine with full log-probabilities returns as many as asked).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from typing import TYPE_CHECKING, Any, Protocol, Sequence

import torch

from .generate import GREEDY
from .runner import Runner, runner_for
from .samplers.chain import sample_next
from .samplers.stages import SamplerConfig

if TYPE_CHECKING:  # pragma: no cover
    from ..model.load import Model


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do; a job adapts to it or reports "not checked" with the reason. An adapter states what
    differs from the defaults (token-id prompts, one request at a time, no extras)."""

    server: str  # "genprobe" | "vllm" | "llama.cpp" | "llama-cpp-python" | "openai-compatible" | a fake's name
    max_top_k: int  # largest k of log-probabilities per position (0 when none)
    prompt_logprobs: bool = False  # log-probabilities of the prompt's own tokens
    token_prompts: bool = True  # prompts given as token ids (else text, tokenized by the server)
    concurrency: int = 1  # requests served at once (1: one after another)
    seed: bool = False  # a per-request seed is honoured
    cache_block: int = 1  # a prefix cache reuses whole blocks of this many tokens
    step_budget: int | None = None  # tokens one engine step computes: longer prompts are prefilled in chunks
    cache_bypass: bool = False  # a request can skip reading the prefix cache (``Request.read_cache``)
    exact: bool | None = None  # float32 arithmetic throughout (True), reduced precision (False), not known (None)
    label: str = ""  # the deployment's precision as reported ("float32", "bfloat16", "Q4_K/kv-f16", ...)


#: The :class:`SamplerConfig` fields a request carries (the OpenAI API's sampler); the rest must stay at their defaults
API_FIELDS = {"greedy", "temperature", "top_k", "top_p", "ban_ids", "order", "engine"}


def check_api_sampler(sampler: SamplerConfig) -> None:
    """ValueError naming the first setting a backend request cannot carry (min-p, typical-p, penalties, DRY, XTC,
    …: refused, never approximated)."""
    for f in dataclass_fields(SamplerConfig):
        if f.name not in API_FIELDS and getattr(sampler, f.name) != f.default:
            raise ValueError(f"a backend request takes temperature, top-p, top-k and banned ids; not {f.name}")


@dataclass(frozen=True)
class Request:
    """One completion: ``prompt`` as token ids (or text where the backend takes only text), sampled with ``sampler``
    (greedy by default) and ``seed``."""

    prompt: tuple[int, ...] | str
    max_tokens: int
    sampler: SamplerConfig = GREEDY
    seed: int | None = None  # a sampled request's seed (None: the backend's own)
    stop: tuple[str, ...] = ()
    logprobs: int = 0  # top-k per generated position (0: only the sampled token's, where offered)
    prompt_logprobs: int | None = None  # top-k per prompt position (None: not asked)
    read_cache: bool = True  # False: compute the whole prompt even where a prefix cache holds it

    def __post_init__(self) -> None:
        check_api_sampler(self.sampler)

    def api_sampler(self) -> dict[str, Any]:
        """The sampler as the OpenAI API's fields: ``temperature`` (0: greedy), ``top_p`` (1: off), ``top_k``
        (0: off) and ``seed`` (None when greedy)."""
        s = self.sampler
        if s.greedy:
            return {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": None}
        return {"temperature": s.temperature, "top_p": s.top_p or 1.0, "top_k": s.top_k or 0, "seed": self.seed}


@dataclass
class Position:
    """One position: the token there, its log-probability (None when not returned) and the top-k ``{id: logprob}``."""

    token: int
    logprob: float | None
    top: dict[int, float] = field(default_factory=dict)


@dataclass
class Response:
    """What a backend returned for one :class:`Request`."""

    prompt_ids: list[int]  # the ids the backend ran (a text prompt tokenized by it)
    token_ids: list[int]
    positions: list[Position]  # one per generated token
    finish_reason: str | None  # "stop" | "length" | None when not said
    text: str = ""
    prompt_positions: list[Position | None] | None = None  # one per prompt token (the first is None), when asked
    cached_tokens: int | None = None  # prompt tokens served from a prefix cache, when the backend says
    # where a backend returns every position's whole distribution: log-probabilities ``(rows, V)``, row t predicts
    # token ``rows_from + t + 1`` of prompt_ids + token_ids (compared instead of the positions' top-k)
    rows: torch.Tensor | None = field(default=None, repr=False)
    rows_from: int = 0


class Backend(Protocol):
    """Anything that completes requests with log-probabilities. An adapter subclasses it and inherits the defaults
    below (one request at a time, no tokenizer or chat template to report, no cache to empty), overriding only what
    its engine really does."""

    capabilities: Capabilities
    model_name: str

    def complete(self, request: Request) -> Response:
        """One request, on its own."""
        ...

    def complete_many(self, requests: Sequence[Request], concurrency: int) -> list[Response]:
        """``requests`` with up to ``concurrency`` in flight at once, in order (default: one after another)."""
        return [self.complete(r) for r in requests]

    def tokenize(self, text: str) -> list[int] | None:
        """``text`` as the backend tokenizes a prompt (special tokens included), None when it cannot say."""
        return None

    def chat_ids(self, messages: Sequence[dict[str, str]]) -> list[int] | None:
        """The prompt ids the backend builds from chat ``messages`` (generation prompt added), None when unknown."""
        return None

    def reset_cache(self) -> bool:
        """Empty the prefix cache; False when the backend cannot (a live server's holds what others sent). Default:
        True (no cache to empty)."""
        return True


def stop_text(text: str, stops: Sequence[str]) -> str:
    """``text`` cut before the first of ``stops`` it holds (the OpenAI API's rule)."""
    cut = [text.find(st) for st in stops if st in text]
    return text[: min(cut)] if cut else text


def full_logprobs(runner: Runner, ids: Sequence[int]) -> torch.Tensor:
    """``log_softmax`` (in float32) of one uncached forward of ``ids``: ``(len(ids), V)``; row t predicts t + 1."""
    x = torch.tensor([list(ids)], dtype=torch.long)
    with torch.inference_mode():
        logits = runner.full(x, torch.ones_like(x, dtype=torch.bool))[0]
    return torch.log_softmax(logits.float(), dim=-1)


def top_positions(logprobs: torch.Tensor, tokens: Sequence[int], k: int) -> list[Position]:
    """Positions of ``tokens`` from rows of log-probabilities ``(len(tokens), V)``: each token's value and the top
    ``k`` (ties broken by the lower id, as ``torch.topk`` on CPU)."""
    out = []
    for row, tok in zip(logprobs, tokens, strict=True):
        top: dict[int, float] = {}
        if k > 0:
            vals, ids = torch.topk(row, min(k, row.numel()))
            top = {int(i): float(v) for i, v in zip(ids, vals, strict=True)}
        out.append(Position(int(tok), float(row[tok]), top))
    return out


class EngineBackend(Backend):
    """genprobe's own engine as a :class:`Backend`: full log-probabilities of a loaded ``Model`` in its own dtype,
    one uncached forward per generated token (exact, and slow: small models and tests), each token chosen by the
    engine's own sampler chain with a generator seeded by the request's seed."""

    def __init__(self, model: "Model", name: str = "genprobe"):
        self.model = model
        self.model_name = name
        self.runner = runner_for(model)
        dtype = next(model.module.parameters()).dtype
        self.capabilities = Capabilities(
            server="genprobe",
            max_top_k=int(model.vocab_size),
            prompt_logprobs=True,
            seed=True,
            exact=dtype == torch.float32,
            label=str(dtype).removeprefix("torch."),
        )

    def complete(self, request: Request) -> Response:
        """Generate up to ``max_tokens`` (stopping at end-of-text or a stop string), log-probs of every position."""
        if isinstance(request.prompt, str):
            raise ValueError("the engine backend takes token-id prompts")
        s = request.sampler
        gen = None if s.greedy else torch.Generator().manual_seed(request.seed or 0)
        ids, out, reason = list(request.prompt), [], "length"
        for _ in range(request.max_tokens):
            tok = int(sample_next(full_logprobs(self.runner, ids)[-1], None, s, gen)[0])
            out.append(tok)
            ids.append(tok)
            if tok == self.model.eos_id or any(st in self.model.decode(out) for st in request.stop):
                reason = "stop"
                break
        rows = full_logprobs(self.runner, ids)
        P = len(request.prompt)
        positions = top_positions(rows[P - 1 : P - 1 + len(out)], out, request.logprobs)
        prompt_positions: list[Position | None] | None = None
        if request.prompt_logprobs is not None:
            prompt_positions = [None, *top_positions(rows[: P - 1], request.prompt[1:], request.prompt_logprobs)]
        text = stop_text(self.model.decode(out), request.stop)
        return Response(list(request.prompt), out, positions, reason, text, prompt_positions)

    def tokenize(self, text: str) -> list[int] | None:
        """The model's own tokenizer."""
        return self.model.encode(text)
