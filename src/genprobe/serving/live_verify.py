"""Run the live verifier's phases on a :class:`~genprobe.engine.backend.Backend` (see :mod:`genprobe.serving.live`
for what each phase judges and on which scale)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Callable, Sequence

from ..engine.backend import Backend, Request, Response, Sampler
from ..verify.compare import Thresholds
from .compare import ReferenceLogprobs
from .live import CHAT, NOT_CHECKED, Judge, LivePhase, LiveReport, LiveSettings, random_prompts

PROBE = "The quick brown fox, 42 times: naïve café — ok?"
PREFIX_PROMPTS = 6  # the two prompts after these end the prefix phase's pair; the others make its shared prefix
# ... up to this many tokens (half the context at most): more than two of vLLM's 128-token CPU cache blocks (18 of
# its 16-token GPU ones), so a server whose cache works serves some of it from the cache
PREFIX_TOKENS = 288


def check_same_model(backend: Backend, reference: Any, reference_name: str) -> None:
    """A ``ValueError`` (one line) when the server tokenizes a probe string differently from ``reference``: it serves
    another model. A leading BOS on either side is not a difference (servers add it to prompts)."""
    served = backend.tokenize(PROBE)
    if served is None:
        return
    ours = reference.encode(PROBE)
    bos = getattr(getattr(reference.tokenizer, "hf", None), "bos_token_id", None)
    if served and bos is not None and served[0] == bos and (not ours or ours[0] != bos):
        served = served[1:]
    if served != ours:
        i = next((j for j, (a, b) in enumerate(zip(served, ours, strict=False)) if a != b), min(len(served), len(ours)))
        raise ValueError(
            f"the server's model {backend.model_name!r} tokenizes a probe string differently from --reference "
            f"{reference_name} (token {i}: {served[i : i + 1]} vs {ours[i : i + 1]}): it serves another model"
        )


def _check_vocabulary(responses: Sequence[Response], vocab: int, name: str) -> None:
    for r in responses:
        bad = [t for t in r.token_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(
                f"the server returned token id {bad[0]}, outside --reference {name}'s vocabulary ({vocab})"
            )


def _requests(backend: Backend, reference: Any, texts: Sequence[str], s: LiveSettings) -> list[Request]:
    token = backend.capabilities.token_prompts
    k = min(s.top_k, backend.capabilities.max_top_k)
    return [Request(tuple(reference.encode(t)) if token else t, s.steps, logprobs=k) for t in texts]


def prompt_phase(backend: Backend, judge: Judge, requests: Sequence[Request]) -> LivePhase:
    """Prompt log-probabilities of up to 8 requests, against the reference's rows."""
    if not backend.capabilities.prompt_logprobs:
        return LivePhase(
            "prompt", NOT_CHECKED, note=f"the {backend.capabilities.server} server returns no prompt log-probabilities"
        )
    asked = [Request(r.prompt, 1, logprobs=r.logprobs, prompt_logprobs=r.logprobs) for r in requests[:8]]
    return judge.absolute("prompt", [backend.complete(r) for r in asked], prompt=True)


def prefix_phase(
    backend: Backend, judge: Judge, reference: Any, texts: Sequence[str], s: LiveSettings, floor: float
) -> LivePhase:
    """Two prompts sharing a long prefix, one after the other, then the first again: each against float32
    recomputation of its own prompt (a cache that serves the other prompt's entries moves them by many floors)."""
    tails = texts[PREFIX_PROMPTS : PREFIX_PROMPTS + 2]
    context = reference.max_positions
    # what the context leaves after the longer prompt end (and a separator) and the generated tokens
    room = None if context is None else context - s.steps - max(len(reference.encode(t)) for t in tails) - 2
    limit = PREFIX_TOKENS if room is None else min(PREFIX_TOKENS, room)
    words: list[str] = []
    for w in " ".join([*texts[:PREFIX_PROMPTS], *texts[PREFIX_PROMPTS + 2 :]]).split():
        if len(reference.encode(" ".join([*words, w]))) > limit:
            break
        words.append(w)
    base = " ".join(words)
    pair = [f"{base} {tails[0]}", f"{base} {tails[1]}"]
    a, b = _requests(backend, reference, pair, s)
    served = [backend.complete(r) for r in (a, b, a)]
    phase = judge.relative("prefix", served, [served[0], served[1], served[0]], floor)
    shared = len(_common_prefix(served[0].prompt_ids, served[1].prompt_ids))
    phase.note = f"{shared} prompt tokens shared"
    if phase.cached_tokens is None:
        phase.note += "; the server does not say how many it served from a cache"
    elif phase.cached_tokens == 0:  # the answers were checked, the cache was not: nothing to look at
        phase.verdict = NOT_CHECKED
        phase.note += (
            f"; the server served none from a cache: its prefix cache was not exercised (off, or a cache block "
            f"longer than the {shared} shared tokens); the answers themselves were within {phase.gap_ratio:.2f}x "
            "the lone floor"
        )
    return phase


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> list[int]:
    out = []
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        out.append(x)
    return out


def concurrency_phase(
    backend: Backend,
    judge: Judge,
    requests: Sequence[Request],
    alone: Sequence[Response],
    s: LiveSettings,
    floor: float,
) -> LivePhase:
    """The greedy requests again, ``concurrency`` in flight at once, against their lone runs."""
    if s.concurrency < 2 or backend.capabilities.concurrency < 2:
        return LivePhase("concurrency", NOT_CHECKED, note="the backend serves one request at a time")
    served = backend.complete_many(requests, s.concurrency)
    phase = judge.relative("concurrency", served, alone, floor)
    phase.note = f"{len(requests)} requests, {s.concurrency} in flight"
    return phase


def seed_phase(backend: Backend, request: Request) -> LivePhase:
    """A sampled request (temperature 1) sent twice with one seed: the same tokens."""
    if not backend.capabilities.seed:
        return LivePhase("seed", NOT_CHECKED, note="the server takes no per-request seed")
    sampled = Request(request.prompt, request.max_tokens, Sampler(temperature=1.0, seed=1234), logprobs=0)
    first, second = backend.complete(sampled), backend.complete(sampled)
    diff = next((i for i, (x, y) in enumerate(zip(first.token_ids, second.token_ids, strict=False)) if x != y), None)
    if diff is None and len(first.token_ids) == len(second.token_ids):
        return LivePhase("seed", "pass", "tokens", requests=2, divergence_rate=0.0)
    at = diff if diff is not None else min(len(first.token_ids), len(second.token_ids))
    return LivePhase(
        "seed",
        "bug",
        "tokens",
        note=f"seed 1234 sampled different tokens from token {at} on",
        requests=2,
        divergence_rate=1.0,
        first_divergence={"request": 0, "token": at},
    )


def limits_phase(backend: Backend, requests: Sequence[Request], alone: Sequence[Response]) -> LivePhase:
    """``max_tokens`` honoured, and a stop string cut where the greedy text first has it."""
    problems, m = [], 3
    short = backend.complete(Request(requests[0].prompt, m, logprobs=requests[0].logprobs))
    if len(short.token_ids) > m or (len(short.token_ids) < m and short.finish_reason != "stop"):
        problems.append(f"max_tokens {m} gave {len(short.token_ids)} tokens (finish {short.finish_reason})")
    stop_case = next(((r, a) for r, a in zip(requests, alone, strict=True) if len(a.text.strip()) >= 8), None)
    if stop_case is None:
        return LivePhase(
            "limits",
            "bug" if problems else "pass",
            "tokens",
            "; ".join(problems) or "stop sequence not checked: no greedy text long enough",
            requests=1,
        )
    req, lone = stop_case
    stop = lone.text[len(lone.text) // 2 :][:3]
    cut = backend.complete(Request(req.prompt, req.max_tokens, stop=(stop,), logprobs=req.logprobs))
    expected = lone.text[: lone.text.find(stop)]
    if cut.text != expected or cut.finish_reason != "stop":
        problems.append(f"stop {stop!r}: text {cut.text!r} (finish {cut.finish_reason}), expected {expected!r}")
    return LivePhase("limits", "bug" if problems else "pass", "tokens", "; ".join(problems), requests=2)


def chat_phase(backend: Backend, reference: Any) -> LivePhase:
    """The server's prompt ids for :data:`CHAT` against ``transformers``' rendering of the reference's template."""
    hf = getattr(reference.tokenizer, "hf", None)
    if hf is None or not getattr(hf, "chat_template", None):
        return LivePhase("chat", NOT_CHECKED, note="the reference has no chat template")
    served = backend.chat_ids(CHAT)
    if served is None:
        return LivePhase(
            "chat",
            NOT_CHECKED,
            note=f"the {backend.capabilities.server} server has no endpoint that "
            "returns the prompt ids it builds from messages",
        )
    text = hf.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    ours = list(hf.encode(text, add_special_tokens=False))
    if served == ours:
        return LivePhase("chat", "pass", "template", requests=1, positions=len(ours))
    return LivePhase(
        "chat", "bug", "template", note=template_difference(served, ours, reference), requests=1, positions=len(ours)
    )


def template_difference(served: Sequence[int], ours: Sequence[int], reference: Any) -> str:
    """What differs: BOS added or omitted, the system turn missing, else the first differing token."""
    bos = getattr(reference.tokenizer.hf, "bos_token_id", None)
    if bos is not None and list(served) == [bos, *ours]:
        return "the server adds a BOS token the template does not"
    if bos is not None and [bos, *served] == list(ours):
        return "the server omits the template's BOS token"
    notes = []
    if CHAT[0]["content"] not in reference.decode(served):
        notes.append("the system turn is missing")
    i = next((j for j, (a, b) in enumerate(zip(served, ours, strict=False)) if a != b), min(len(served), len(ours)))
    piece = reference.tokenizer.hf.decode
    s = repr(piece(served[i : i + 1])) if i < len(served) else "end"
    o = repr(piece(ours[i : i + 1])) if i < len(ours) else "end"
    notes.append(f"first differing token {i}: server {s}, template {o}")
    return "; ".join(notes)


def verify_live(
    backend: Backend,
    reference: Any,
    reference_name: str,
    settings: LiveSettings | None = None,
    prompts: Sequence[str] | None = None,
    thresholds: Thresholds | None = None,
    log: Callable[[str], None] = lambda _: None,
    url: str = "",
) -> LiveReport:
    """Every phase on ``backend`` against float32 recomputation of ``reference`` (a loaded float32 ``Model``)."""
    th = thresholds or Thresholds()
    settings = settings or LiveSettings()
    check_same_model(backend, reference, reference_name)
    need = max(settings.requests, PREFIX_PROMPTS + 2)
    texts = list(prompts) if prompts else random_prompts(need, settings.seed)
    if len(texts) < PREFIX_PROMPTS + 2:
        raise ValueError(f"give at least {PREFIX_PROMPTS + 2} prompts (got {len(texts)})")
    judge = Judge(ReferenceLogprobs(reference), th, settings.top_k)
    requests = _requests(backend, reference, texts[: settings.requests], settings)
    log(f"greedy: {len(requests)} requests, one at a time")
    alone = [backend.complete(r) for r in requests]
    _check_vocabulary(alone, int(reference.vocab_size), reference_name)
    if not any(r.positions for r in alone):
        raise ValueError(f"the server at {url or backend.model_name} returned no log-probabilities: nothing to compare")
    greedy = judge.absolute("greedy", alone)
    floor = judge.stats(alone)[2]
    log("prompt, prefix, concurrency, seed, limits, chat")
    phases = [
        prompt_phase(backend, judge, requests),
        greedy,
        prefix_phase(backend, judge, reference, texts, settings, floor),
        concurrency_phase(backend, judge, requests, alone, settings, floor),
        seed_phase(backend, requests[0]),
        limits_phase(backend, requests, alone),
        chat_phase(backend, reference),
    ]
    caps = asdict(backend.capabilities)
    return LiveReport(
        url, backend.capabilities.server, backend.model_name, reference_name, caps, asdict(settings), phases
    )
