"""verify-serving: does a deployment compute the model's log-probabilities? One verifier for every engine.

Each phase (:data:`PHASES`, the ``*_phase`` functions below, in order) sends, through the
:class:`~genprobe.engine.backend.Backend` protocol, a workload that exercises one thing a serving engine changes —
continuous batching, prefix caching, chunked prefill, reduced precision — and compares every log-probability returned
with float32 recomputation (:mod:`genprobe.serving.judge`). Each engine is an adapter whose
:class:`~genprobe.engine.backend.Capabilities` say what it can do; a phase it cannot support is "not checked" with
the reason, never "pass". Only the prefix-cache phases read a prefix cache, so a cache fault is named where it is.
What each phase sends and how it is judged: docs/live-serving.md ("Phases and verdicts") and docs/vllm.md.
"""

from __future__ import annotations

import os
import random
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from ..engine.backend import Backend, Request, Response
from ..engine.samplers.stages import SamplerConfig
from ..verify.compare import Thresholds
from .judge import NOT_CHECKED, Judge, PhaseReport, reference_logprobs, worst_verdict

if TYPE_CHECKING:  # pragma: no cover
    from ..model.load import Model
    from .engine import EngineOptions

PHASES: tuple[str, ...] = ("prompt", "greedy", "batch", "prefix", "prefix_uncached", "diverge_boundary")
PHASES += ("diverge_inside", "chunked_prefill", "seed", "limits", "chat")
PROBE = "The quick brown fox, 42 times: naïve café — ok?"
WORDS = (
    "the river morning house small light old road winter city quiet people across under bright long water stone "
    "field garden window again before after evening north green story music table letter voice between"
).split()
CHAT = [
    {"role": "system", "content": "You are a careful assistant."},
    {"role": "user", "content": "Name three rivers."},
]
PREFIX_PROMPTS = 6  # text workloads: the two prompts after these end the prefix pair; the others make its prefix
# ... up to this many tokens (half the context at most): more than two of vLLM's 128-token CPU cache blocks
PREFIX_TOKENS = 288
BATCH_FRACTIONS = (0.0, 0.15, 0.3, 0.45, 0.6, 0.75, 0.9, 1.0)  # id workloads: batch prompt lengths, shares of room


@dataclass
class ServingReport:
    """verify-serving's result: every phase of every deployment."""

    JSON_PROPERTIES = ("verdict", "verdict_by_dtype")  # computed from the phases, kept in the JSON form

    model: str
    reference: str
    thresholds: Thresholds
    settings: dict[str, Any]
    server: str = ""
    model_name: str = ""
    url: str = ""  # a live server's
    capabilities: list[dict[str, Any]] = field(default_factory=list)
    engines: list[dict] = field(default_factory=list)
    phases: list[PhaseReport] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        """The worst checked phase's verdict ("not checked" when none was)."""
        checked = [p.verdict for p in self.phases if p.verdict != NOT_CHECKED]
        return worst_verdict(checked) if checked else NOT_CHECKED

    @property
    def verdict_by_dtype(self) -> dict[str, str]:
        """The worst checked phase verdict per deployment."""
        out: dict[str, list[str]] = {}
        for p in self.phases:
            out.setdefault(p.dtype, []).append(p.verdict if p.verdict != NOT_CHECKED else "pass")
        return {k: worst_verdict(v) for k, v in out.items()}

    def add(self, run: Run, engine: dict | None = None, extra: Sequence[Callable[[Run], PhaseReport]] = ()) -> None:
        """Every phase of :data:`PHASES` (then ``extra``, its engine's own) on one deployment (``run``'s backend),
        labelled with its precision, with its capabilities and its ``engine``'s description."""
        caps, vocab = run.backend.capabilities, int(run.reference.vocab_size)
        self.server, self.model_name = caps.server, run.backend.model_name
        self.capabilities.append(asdict(caps))
        self.engines += [engine] if engine is not None else []
        prompt = prompt_phase(run)
        alone = [run.backend.complete(run.request(p)) for p in run.work.alone]
        bad = [t for r in alone for t in r.token_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"the backend returned token id {bad[0]}, outside the reference's vocabulary ({vocab})")
        if not any(r.positions or r.rows is not None for r in alone):
            where = f"the {caps.server} backend {run.backend.model_name}"
            raise ValueError(f"{where} returned no log-probabilities: nothing to compare")
        phases = [prompt, greedy_phase(run, alone), batch_phase(run, alone), prefix_phase(run)]
        phases += [prefix_uncached_phase(run), *divergence_phases(run), chunked_phase(run), seed_phase(run)]
        phases += [limits_phase(run, alone), chat_phase(run), *(phase(run) for phase in extra)]
        for p in phases:
            p.dtype = caps.label
        self.phases += phases


@dataclass(frozen=True)
class Settings:
    """What the verifier sends: ``steps`` greedy tokens, ``top_k`` log-probs per position, ``concurrency`` requests
    in flight in the batch phase; ``requests`` prompts (text workloads) and the ``seed`` of the random prompts."""

    requests: int = 64
    concurrency: int = 8
    steps: int = 16
    top_k: int = 5
    seed: int = 0


# ---- workloads ---------------------------------------------------------------------------------------------------
Prompt = tuple[int, ...] | str


@dataclass
class Workload:
    """The prompts of every phase (token ids, or text for a server that takes only text)."""

    alone: list[Prompt]
    batch: list[Prompt]
    prefix: list[Prompt]  # two prompts sharing all but their last tokens
    long: list[Prompt] = field(default_factory=list)  # longer than the step budget


def build_workload(
    room: int, budget: int, vocab: int, prompts: Sequence[Sequence[int]] = (), seed: int = 0
) -> Workload:
    """Token-id prompts sized to an engine: ``room`` = longest admissible prompt, ``budget`` = its per-step token
    budget; the user's prompts cycled, or seeded random ids when none are given."""
    if room < 4:
        raise ValueError(f"the context leaves room for prompts of only {room} tokens; lower the number of steps")
    rng, flat, at = random.Random(seed), [int(t) for p in prompts for t in p], [0]

    def take(n: int) -> tuple[int, ...]:
        at[0] += n
        if flat:
            return tuple(flat[(at[0] - n + i) % len(flat)] for i in range(n))
        return tuple(rng.randrange(vocab) for _ in range(n))

    short_max = max(2, min(room, budget))
    alone: list[Prompt] = [tuple(p)[:room] for p in prompts if p]
    alone = alone or [take(n) for n in sorted({2, max(2, short_max // 2), short_max})]
    batch: list[Prompt] = [take(max(2, round(2 + (room - 2) * f))) for f in BATCH_FRACTIONS]
    prefix = take(max(2, room - 4))
    lengths = sorted({room, max(budget + 1, (room + budget + 1) // 2)})
    long: list[Prompt] = [take(n) for n in lengths if budget < n <= room]
    return Workload(alone, batch, [prefix + take(4), prefix + take(4)], long)


def random_prompts(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct seeded word sequences of 6–14 words (text: every server takes it)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 14))).capitalize() for _ in range(n)]


def text_workload(reference: Model, texts: Sequence[str], settings: Settings, token_prompts: bool) -> Workload:
    """A live server's workload: ``settings.requests`` texts alone and together, and a pair sharing a prefix of up
    to :data:`PREFIX_TOKENS` tokens made of the other texts' words (half the context at most)."""
    if len(texts) < PREFIX_PROMPTS + 2:
        raise ValueError(f"give at least {PREFIX_PROMPTS + 2} prompts (got {len(texts)})")
    tails = texts[PREFIX_PROMPTS : PREFIX_PROMPTS + 2]
    context = reference.max_positions
    room = None if context is None else context - settings.steps - max(len(reference.encode(t)) for t in tails) - 2
    limit = PREFIX_TOKENS if room is None else min(PREFIX_TOKENS, room)
    words: list[str] = []
    for w in " ".join([*texts[:PREFIX_PROMPTS], *texts[PREFIX_PROMPTS + 2 :]]).split():
        if len(reference.encode(" ".join([*words, w]))) > limit:
            break
        words.append(w)
    base = " ".join(words)

    def prompt(text: str) -> Prompt:
        return tuple(reference.encode(text)) if token_prompts else text

    alone = [prompt(t) for t in texts[: settings.requests]]
    return Workload(alone, alone, [prompt(f"{base} {tails[0]}"), prompt(f"{base} {tails[1]}")])


# ---- phases ------------------------------------------------------------------------------------------------------
@dataclass
class Run:
    """What every phase reads: the backend, the judge, the workload, the settings and the reference model."""

    backend: Backend
    judge: Judge
    work: Workload
    settings: Settings
    reference: Model

    @property
    def k(self) -> int:
        """Log-probabilities asked per position."""
        return min(self.settings.top_k, self.backend.capabilities.max_top_k)

    def request(self, prompt: Prompt, steps: int | None = None, read_cache: bool = False, **kw: Any) -> Request:
        """A greedy request; only the prefix-cache phases read the cache."""
        steps = self.settings.steps if steps is None else steps
        return Request(prompt, steps, logprobs=self.k, read_cache=read_cache, **kw)


def not_checked(phase: str, why: str) -> PhaseReport:
    """A phase the backend cannot support, and why."""
    return PhaseReport(phase, verdict=NOT_CHECKED, note=why)


def prompt_phase(run: Run) -> PhaseReport:
    """Prompt log-probabilities of up to 8 prompts."""
    caps = run.backend.capabilities
    if not caps.prompt_logprobs:
        return not_checked("prompt", f"the {caps.server} backend returns no prompt log-probabilities")
    asked = [run.request(p, 1, prompt_logprobs=run.k) for p in run.work.alone[:8]]
    return run.judge.phase("prompt", [run.backend.complete(r) for r in asked], prompt=True)


def greedy_phase(run: Run, alone: Sequence[Response]) -> PhaseReport:
    """The prompts one at a time (``alone``: their responses); their gap is the later phases' floor where the
    deployment's precision is not known."""
    rep = run.judge.phase("greedy", alone)
    if run.judge.lone_gap is None and run.judge.floor is None and not run.judge.exact:
        run.judge.lone_gap = rep.mean_abs_dlogp or 0.0
    return rep


def batch_phase(run: Run, alone: Sequence[Response]) -> PhaseReport:
    """The batch prompts together; when they are the greedy prompts, their tokens against the lone runs. Mixed
    token budgets otherwise, so that requests leave the running batch at different steps."""
    caps, s, work = run.backend.capabilities, run.settings, run.work
    in_flight = min(s.concurrency, caps.concurrency)
    if in_flight < 2:
        return not_checked("batch", "the backend serves one request at a time")
    same = work.batch is work.alone
    budgets = [s.steps if same else max(1, s.steps - 3 * (i % 3)) for i in range(len(work.batch))]
    served = run.backend.complete_many([run.request(p, b) for p, b in zip(work.batch, budgets, strict=True)], in_flight)
    rep = run.judge.phase("batch", served, note=f"{len(served)} requests, {in_flight} in flight")
    if same:
        firsts = [first_difference(a.token_ids, b.token_ids) for a, b in zip(alone, served, strict=True)]
        diverged = [(r, t) for r, t in enumerate(firsts) if t is not None]
        rep.divergence_rate = len(diverged) / len(served)
        rep.token_divergence = {"request": diverged[0][0], "token": diverged[0][1]} if diverged else None
    return rep


def reuse_check(cached: int, shared: int, block: int) -> str | None:
    """Why serving ``cached`` prompt tokens from the cache is wrong for a request sharing ``shared`` tokens, or None.

    A correct prefix cache serves whole blocks of the shared prefix only: at most ``shared`` rounded down to
    the block. More means a lookup that matched tokens the requests do not share (the logits may still look
    close when the wrong tokens' keys happen to be similar, so this is checked on its own)."""
    allowed = shared // block * block
    if cached > allowed:
        return (
            f"{cached} prompt tokens were served from the prefix cache, but the request shares only {shared} "
            f"leading tokens with the cached one ({allowed} in whole blocks of {block}): the cache was reused for "
            "a different prompt"
        )
    return None


def _cache_pair(run: Run, name: str, first: Prompt, second: Sequence[Prompt]) -> PhaseReport:
    """``first`` then each of ``second`` through the prefix cache, emptied first; what each later one was served
    from the cache checked against the prefix it shares with the one before (where the cache could be emptied: a
    live server's may hold the same prompts from earlier traffic)."""
    prompts, emptied = [first, *second], run.backend.reset_cache()
    served = [run.backend.complete(run.request(p, read_cache=True)) for p in prompts]
    rep = run.judge.phase(name, served)
    block = run.backend.capabilities.cache_block
    shared = [common_prefix(a.prompt_ids, b.prompt_ids) for a, b in zip(served, served[1:], strict=False)]
    cached = [r.cached_tokens for r in served[1:] if r.cached_tokens is not None]
    rep.shared_tokens, rep.cached_tokens = min(shared), max(cached) if cached else None
    wrong = [w for r, n in zip(served[1:], shared, strict=True) if (w := reuse_check(r.cached_tokens or 0, n, block))]
    if wrong and emptied:
        rep.verdict, rep.note = "bug", wrong[0]
    elif wrong:
        rep.note = "what was served from the cache is not checked: the backend's cache cannot be emptied first"
    return rep


def prefix_phase(run: Run) -> PhaseReport:
    """The prefix pair, then the first again: each against recomputation of its own prompt (a cache that serves the
    other prompt's entries moves them by far more than noise), and what was served from the cache checked."""
    a, b = run.work.prefix
    rep = _cache_pair(run, "prefix", a, [b, a])
    why = f"{rep.shared_tokens} prompt tokens shared"
    if rep.cached_tokens is None:
        rep.note = rep.note or f"{why}; the backend does not say how many it served from a cache"
    elif rep.cached_tokens == 0 and rep.verdict != NOT_CHECKED:  # the answers were checked, the cache was not
        rep.note = (
            f"{why}; the backend served none from a cache: its prefix cache was not exercised (off, or a cache block "
            f"longer than the shared tokens); the answers themselves: {rep.verdict}"
        )
        rep.verdict = NOT_CHECKED
    return rep


def prefix_uncached_phase(run: Run) -> PhaseReport:
    """The prefix pair's second prompt computed whole, the cache not read."""
    if not run.backend.capabilities.cache_bypass:
        return not_checked("prefix_uncached", "a request cannot ask this backend to skip its prefix cache")
    return run.judge.phase("prefix_uncached", [run.backend.complete(run.request(run.work.prefix[1]))])


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


def diverging_request(base: Sequence[int], shared: int, vocab: int) -> tuple[int, ...]:
    """``base``'s first ``shared`` tokens, then every later token replaced by another id (same length)."""
    return tuple(int(t) for t in base[:shared]) + tuple((int(t) + 1) % vocab for t in base[shared:])


def divergence_phases(run: Run) -> list[PhaseReport]:
    """The prefix pair's first prompt, then one sharing its first cache blocks (and half a block more)."""
    caps, first = run.backend.capabilities, run.work.prefix[0]
    names = ("diverge_boundary", "diverge_inside")
    if isinstance(first, str):
        return [not_checked(n, "the backend takes text prompts: a prefix cut mid-block needs token ids") for n in names]
    points = divergence_points(len(first), caps.cache_block)
    reports = []
    for name in names:
        if name not in points:
            why = f"the prefix workload ({len(first)} tokens) spans fewer than two cache blocks of {caps.cache_block}"
            reports.append(not_checked(name, why if caps.cache_block > 1 else "the cache reuses single tokens"))
            continue
        second = diverging_request(first, points[name], int(run.reference.vocab_size))
        rep = _cache_pair(run, name, first, [second])
        if rep.cached_tokens == 0 and rep.verdict != "bug":
            rep.note = "nothing was served from the prefix cache (the engine did not reuse the shared blocks)"
        reports.append(rep)
    return reports


def chunked_phase(run: Run) -> PhaseReport:
    """Prompts longer than the per-step token budget."""
    budget = run.backend.capabilities.step_budget
    if budget is None:
        return not_checked("chunked_prefill", "the backend does not say its per-step token budget")
    if not run.work.long:
        why = f"the step budget ({budget}) is not below the longest admissible prompt: set it lower to force chunks"
        return not_checked("chunked_prefill", why)
    chunks = max(-(-len(p) // budget) for p in run.work.long)
    served = run.backend.complete_many([run.request(p) for p in run.work.long], len(run.work.long))
    return run.judge.phase("chunked_prefill", served, prefill_chunks=chunks)


def seed_phase(run: Run) -> PhaseReport:
    """A sampled request (temperature 1) sent twice with one seed: the same tokens."""
    if not run.backend.capabilities.seed:
        return not_checked("seed", "the backend takes no per-request seed")
    sampled = Request(run.work.alone[0], run.settings.steps, SamplerConfig(temperature=1.0), seed=1234)
    first, second = run.backend.complete(sampled), run.backend.complete(sampled)
    at = first_difference(first.token_ids, second.token_ids)
    rep = PhaseReport("seed", judged_on="tokens", requests=2, divergence_rate=float(at is not None))
    if at is not None:
        rep.verdict, rep.note = "bug", f"seed 1234 sampled different tokens from token {at} on"
        rep.token_divergence = {"request": 0, "token": at}
    return rep


def limits_phase(run: Run, alone: Sequence[Response]) -> PhaseReport:
    """``max_tokens`` honoured, and a stop string cut where the greedy text first has it."""
    problems, m, backend = [], 3, run.backend
    short = backend.complete(run.request(run.work.alone[0], m))
    if len(short.token_ids) > m or (len(short.token_ids) < m and short.finish_reason != "stop"):
        problems.append(f"max_tokens {m} gave {len(short.token_ids)} tokens (finish {short.finish_reason})")
    case = next(((p, a) for p, a in zip(run.work.alone, alone, strict=True) if len(a.text.strip()) >= 8), None)
    if case is not None:
        prompt, lone = case
        stop = lone.text[len(lone.text) // 2 :][:3]
        cut = backend.complete(run.request(prompt, stop=(stop,)))
        expected = lone.text[: lone.text.find(stop)]
        if cut.text != expected or cut.finish_reason != "stop":
            problems.append(f"stop {stop!r}: text {cut.text!r} (finish {cut.finish_reason}), expected {expected!r}")
    note = "; ".join(problems) or ("" if case else "stop sequence not checked: no greedy text long enough")
    verdict = "bug" if problems else "pass"
    return PhaseReport("limits", verdict=verdict, judged_on="tokens", note=note, requests=1 + (case is not None))


def chat_phase(run: Run) -> PhaseReport:
    """The server's prompt ids for :data:`CHAT` against ``transformers``' rendering of the reference's template."""
    reference, caps = run.reference, run.backend.capabilities
    hf = getattr(reference.tokenizer, "hf", None)
    if hf is None or not getattr(hf, "chat_template", None):
        return not_checked("chat", "the reference has no chat template")
    served = run.backend.chat_ids(CHAT)
    if served is None:
        why = f"the {caps.server} backend has no endpoint that returns the prompt ids it builds from messages"
        return not_checked("chat", why)
    text = hf.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    ours = list(hf.encode(text, add_special_tokens=False))
    rep = PhaseReport("chat", judged_on="template", requests=1, positions=len(ours))
    if served == ours:
        return rep
    # what differs: BOS added or omitted, the system turn missing, else the first differing token
    rep.verdict, bos, i = "bug", getattr(hf, "bos_token_id", None), common_prefix(served, ours)
    if bos is not None and served == [bos, *ours]:
        rep.note = "the server adds a BOS token the template does not"
        return rep
    if bos is not None and [bos, *served] == ours:
        rep.note = "the server omits the template's BOS token"
        return rep
    s = repr(hf.decode(served[i : i + 1])) if i < len(served) else "end"
    o = repr(hf.decode(ours[i : i + 1])) if i < len(ours) else "end"
    missing = "" if CHAT[0]["content"] in hf.decode(served) else "the system turn is missing; "
    rep.note = f"{missing}first differing token {i}: server {s}, template {o}"
    return rep


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """First index where ``a`` and ``b`` differ (a length difference counts), None when equal."""
    i = common_prefix(a, b)
    return None if i == len(a) == len(b) else i


# ---- the whole check ---------------------------------------------------------------------------------------------
def verify_backend(
    backend: Backend,
    reference: Model,
    reference_name: str,
    settings: Settings | None = None,
    prompts: Sequence[str] | None = None,
    thresholds: Thresholds | None = None,
    log: Callable[[str], None] = lambda _: None,
    url: str = "",
) -> ServingReport:
    """Every phase on a live ``backend`` (a text workload) against float32 recomputation of ``reference`` (a loaded
    float32 ``Model``)."""
    th, settings = thresholds or Thresholds(), settings or Settings()
    # the same model: the backend tokenizes a probe string as ``reference`` does (a leading BOS on either side is no
    # difference: servers add it to prompts)
    if (served := backend.tokenize(PROBE)) is not None:
        ours = reference.encode(PROBE)
        bos = getattr(getattr(reference.tokenizer, "hf", None), "bos_token_id", None)
        if served and bos is not None and served[0] == bos and (not ours or ours[0] != bos):
            served = served[1:]
        if served != ours:
            i = common_prefix(served, ours)
            raise ValueError(
                f"the server's model {backend.model_name!r} tokenizes a probe string differently from --reference "
                f"{reference_name} (token {i}: {served[i : i + 1]} vs {ours[i : i + 1]}): it serves another model"
            )
    texts = list(prompts) if prompts else random_prompts(max(settings.requests, PREFIX_PROMPTS + 2), settings.seed)
    work = text_workload(reference, texts, settings, backend.capabilities.token_prompts)
    judge = Judge(reference_logprobs(reference), th, settings.top_k, exact=backend.capabilities.exact)
    log(f"{len(work.alone)} prompts: every phase the {backend.capabilities.server} backend allows")
    report = ServingReport(url or backend.model_name, reference_name, th, asdict(settings), url=url)
    report.add(Run(backend, judge, work, settings, reference))
    return report


# ---- vLLM in process ---------------------------------------------------------------------------------------------
def sized_for_checks(
    model_dir: str | os.PathLike, options: EngineOptions, prompts: Sequence[Sequence[int]], steps: int
) -> EngineOptions:
    """``options`` sized to what the phases need (:func:`genprobe.serving.engine.size_for_workload`): room for the
    longest prompt, and at least 4 × max(token budget, KV block) so that prefixes span cached blocks and long
    prompts several prefill chunks; as many sequences as the batch phase sends at once."""
    from .engine import CPU_BLOCK_SIZE, size_for_workload

    unit = max(options.max_num_batched_tokens or 0, options.block_size or CPU_BLOCK_SIZE)
    longest = max([4 * unit, *(len(p) for p in prompts)])
    return size_for_workload(
        model_dir, options, longest_prompt=longest, new_tokens=steps, sequences=len(BATCH_FRACTIONS)
    )


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
    log: Callable[[str], None] = lambda _: None,
) -> ServingReport:
    """Serve ``model`` with vLLM once per dtype (:class:`~genprobe.serving.engine.VllmBackend`) and run every phase
    against float32 recomputation of ``reference`` (default: the served weights; another directory checks that the
    deployment serves the weights you expect). ``options`` are the engine settings, their ``dtype`` replaced by each
    of ``dtypes``. A reduced-precision deployment's floor is the reference recomputed in its dtype."""
    from ..model.load import load_model
    from .engine import EngineOptions, VllmBackend, served_model, shared_engine

    if steps < 1 or top_k < 1:
        raise ValueError(f"steps and top_k must be >= 1, got steps={steps}, top_k={top_k}")
    if not dtypes:
        raise ValueError("give at least one deployment dtype")
    th, served = thresholds or Thresholds(), served_model(model)
    opts = sized_for_checks(served.path, options or EngineOptions(), prompts, steps)
    ref_model = load_model(reference if reference is not None else served.path)
    if ref_model.vocab_size != served.vocab_size:
        served.cleanup()
        raise ValueError(
            f"the reference has {ref_model.vocab_size} output ids but the served model has {served.vocab_size}"
        )
    float32 = reference_logprobs(ref_model)
    settings = Settings(concurrency=len(BATCH_FRACTIONS), steps=steps, top_k=top_k, seed=seed)
    report = ServingReport(str(model), str(reference if reference is not None else model), th, asdict(settings))
    # the engine is keyed by the source, so a later scan of the same checkpoint reuses it; the export goes when the
    # last engine holding it stops
    for dt in dtypes:
        log(f"starting vLLM ({dt}) on {served.path} …")
        backend = VllmBackend(shared_engine(served, replace(opts, dtype=dt)))
        room = backend.engine.max_model_len - steps
        work = build_workload(room, backend.capabilities.step_budget or room, served.vocab_size, prompts, seed)
        floor = None
        if dt != "float32":
            log(f"recomputing the reference in {dt} too (the floor of that precision)")
            floor = reference_logprobs(load_model(ref_model.source or served.path, dtype=getattr(torch, dt)))
        judge = Judge(float32, th, top_k, floor, exact=dt == "float32")
        report.add(Run(backend, judge, work, settings, ref_model), backend.engine.describe())
    return report
