"""The chapter's phenomena that need no training, measured on any loaded model over a set of prompts and real texts
(docs/three-models.md: what each measures and how), reusing the case study's functions where they take logits
(entropy table, order trap), a runner (timing) or a logits function (the shadow)."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field, fields, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch

from .._io import atomic_write_json, json_safe
from ..corpus.inputs import choose_inputs, token_windows
from ..corpus.tokenizer import encode_quiet
from ..engine.generate import generate
from ..engine.runner import left_padded, runner_for
from ..engine.samplers.stages import SamplerConfig
from ..loops.scan import ScanOptions, engine_batches, scan_batches
from ..model.load import Model
from ._common import Rounded, r
from .exposure import PERTURB_POSITIONS, SHADOW_WINDOW, TAIL_FROM, Shadow, perturbation, wanted_instead
from .sampling import ORDER_TAUS, TEMPERATURES, TemperatureRow, entropy_table, order_trap
from .timing import CacheTiming, run_cache_timing

#: Sampled strategies beside greedy (two of the chapter's seven rows).
SAMPLED: tuple[tuple[str, dict[str, float]], ...] = (
    ("temperature 0.8", {"temperature": 0.8}),
    ("top-p 0.9", {"top_p": 0.9}),
)
TRAP_ORDERS = ("trunc_then_temp", "temp_then_trunc")
TRAP_TOP_P = 0.9
FREE_TAU = 1.0  # the chapter's free-generation confidence samples at τ = 1


@dataclass(frozen=True)
class PhenomenaConfig:
    """Sizes of one run (defaults fit a 64-token context: 16 prefix + 48 new tokens)."""

    max_new_tokens: int = 48
    prefix_tokens: int = 16
    perturb_back: int = 8  # the divergence run changes prefix token ``prefix_tokens - perturb_back``
    max_texts: int = 64  # texts read and continued (the first ones long enough)
    shadow_texts: int = 16
    shadow_positions: tuple[int, ...] = PERTURB_POSITIONS
    shadow_window: int = SHADOW_WINDOW
    batch_size: int = 16
    seed: int = 0
    timing_batches: tuple[int, ...] = (1, 16)
    timing_reps: int = 3
    timing_budget_s: float = 5.0
    match_rows: int = 4  # rows generated both naive and cached to compare their tokens

    def __post_init__(self) -> None:
        if self.max_new_tokens < 8:
            raise ValueError(f"max_new_tokens must be >= 8 (loops need room), got {self.max_new_tokens}")
        if not 1 <= self.perturb_back < self.prefix_tokens:
            raise ValueError(
                f"prefix_tokens must exceed perturb_back ({self.perturb_back}) and perturb_back be >= 1, "
                f"got prefix_tokens {self.prefix_tokens}"
            )
        if self.shadow_window < TAIL_FROM:
            raise ValueError(
                f"shadow_window must be >= {TAIL_FROM} (the tail mean starts there), got {self.shadow_window}"
            )
        sizes = (self.batch_size, self.match_rows, self.max_texts, self.shadow_texts, *self.timing_batches)
        if min(sizes) < 1 or not self.timing_batches:
            raise ValueError(
                "batch_size, match_rows, max_texts and shadow_texts must be >= 1, timing_batches non-empty"
            )


class Subject:
    """A loaded model as the phenomena need it: ids, batched logits and batched generation with bans."""

    def __init__(self, model: Model, cfg: PhenomenaConfig):
        if model.tokenizer is None:
            raise ValueError("the phenomena need the model's tokenizer (prompts and texts are text)")
        self.model, self.cfg = model, cfg
        self.runner = runner_for(model)
        self.bans = tuple(int(i) for i in (model.unk_id, model.eos_id) if i is not None)
        # text → ids without warnings (the char tokenizer's unknown characters are expected in real text)
        self.encode: Callable[[str], list[int]] = partial(encode_quiet, model.tokenizer)

    def fit(self, new_tokens: int, prompt_len: int) -> int:
        """``new_tokens``, shortened to what the context leaves after ``prompt_len`` tokens."""
        limit = self.model.max_positions
        room = new_tokens if limit is None else min(new_tokens, limit - prompt_len)
        if room < 8:
            raise ValueError(f"a {prompt_len}-token prompt leaves {room} new tokens in the context {limit}")
        return room

    @torch.inference_mode()
    def logits(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        """Logits (B, T, V) of left-padded ``rows`` in one uncached forward (float32)."""
        ids, valid = left_padded(rows, max(len(x) for x in rows), 0, self.model.pad_id, torch.device("cpu"))
        return self.runner.full(ids, valid).float()

    def last_logits(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        """Next-token logits (B, V) after each row, ``batch_size`` rows per forward."""
        bs = self.cfg.batch_size
        return torch.cat([self.logits(rows[i : i + bs])[:, -1] for i in range(0, len(rows), bs)])

    def generate(self, prompts: Sequence[Sequence[int]], n: int, sampler: SamplerConfig, logits: bool = False):
        """Yield (tokens (b, n), raw step logits (b, n, V) or None) per batch of ``batch_size`` prompts."""
        bs = self.cfg.batch_size
        for i in range(0, len(prompts), bs):
            res = generate(
                self.runner, prompts[i : i + bs], n, sampler=sampler, seed=self.cfg.seed + i, return_logits=logits
            )
            steps = torch.stack(res.step_logits, 1).float() if res.step_logits is not None else None
            yield torch.tensor(res.tokens, dtype=torch.long), steps

    def sampler(self, **kw: Any) -> SamplerConfig:
        """A sampler with the unknown and end tokens banned."""
        return SamplerConfig(ban_ids=self.bans, **kw)


@dataclass(frozen=True)
class DiversityRow(Rounded):
    """One decoding strategy over every prompt (its sampler as the fields that differ from the defaults): mean
    distinct-2 of the new tokens, shares of the generations that loop exactly and that degenerate."""

    strategy: str
    sampler: dict
    generations: int
    new_tokens: int
    distinct_2: float
    loop_share: float
    degenerate_share: float
    example: str


def diversity(subject: Subject, prompt_ids: list[list[int]], n: int) -> list[DiversityRow]:
    """Greedy and each :data:`SAMPLED` strategy on every prompt: one loop scan each."""
    strategies = [("greedy", subject.sampler(greedy=True))] + [(name, subject.sampler(**kw)) for name, kw in SAMPLED]
    default, rows, cfg = SamplerConfig().to_dict(), [], subject.cfg
    for name, sampler in strategies:
        options = ScanOptions(n, sampler, batch_size=cfg.batch_size, seed=cfg.seed, unk_id=None)
        scan = scan_batches(engine_batches(subject.model), prompt_ids, options)
        s, brief = scan.summary, {k: v for k, v in json_safe(sampler).items() if v != default[k]}
        example = subject.model.decode(prompt_ids[0] + scan.records[0].tokens)
        rows.append(DiversityRow(name, brief, s.n, n, s.mean_distinct_2, s.loop_rate, s.degenerate_rate, example))
    return rows


@dataclass(frozen=True)
class DistributionResult(Rounded):
    """The next-token distribution right after each prompt: entropy vs τ (means over prompts) and the order trap."""

    prompts: int
    vocab_size: int
    log_vocab: float  # ln V, the most entropy a distribution over the vocabulary can have
    entropy_vs_temperature: list[TemperatureRow]
    top_p: float
    order_trap: list[dict]  # per τ: {"tau": τ, order: median kept over prompts, ..., "mean": {order: mean kept}}


def distribution(logits: torch.Tensor, taus=TEMPERATURES, trap_taus=ORDER_TAUS, top_p=TRAP_TOP_P) -> DistributionResult:
    """Entropy table and order trap (the case study's functions) of each row of ``logits`` (B, V), aggregated."""
    tables = [entropy_table(row, taus) for row in logits]
    entropy = [
        TemperatureRow(
            tau, statistics.fmean(t[i].entropy for t in tables), statistics.fmean(t[i].max_prob for t in tables)
        )
        for i, tau in enumerate(taus)
    ]
    traps = [order_trap(row, top_p, trap_taus, TRAP_ORDERS) for row in logits]
    kept = [
        {"tau": tau}
        | {o: statistics.median(t[i][o] for t in traps) for o in TRAP_ORDERS}
        | {"mean": {o: r(statistics.fmean(t[i][o] for t in traps), 1) for o in TRAP_ORDERS}}
        for i, tau in enumerate(trap_taus)
    ]
    B, V = logits.shape
    return DistributionResult(B, V, math.log(V), entropy, top_p, kept)


@dataclass(frozen=True)
class Reading(Rounded):
    """One way of reading a text's continuation, scored against the true tokens."""

    DIGITS_OF = {"accuracy_by_step": 3}

    mode: str  # "teacher forcing" | "free running, greedy" | "free running, τ = 1"
    positions: int
    truth_nll: float  # mean −log p(true token | the context this mode feeds)
    accuracy: float  # share of positions where the model's token (argmax, or the one it generated) is the truth
    own_prob: float  # mean probability of the model's own token there
    own_nll: float
    accuracy_by_step: list[float]


@dataclass
class _Scores:
    """Per-position scores, gathered batch by batch: (rows, N) tensors.

    Scored under the distribution the generations draw from: the ``bans`` (unknown and end token) removed and the
    rest renormalised, so a char model's large ``<unk>`` mass does not count against its own (never ``<unk>``)
    tokens; positions whose true token is banned are not scored.
    """

    bans: tuple[int, ...]
    truth_logp: list[torch.Tensor] = field(default_factory=list)
    own_logp: list[torch.Tensor] = field(default_factory=list)
    hit: list[torch.Tensor] = field(default_factory=list)
    mask: list[torch.Tensor] = field(default_factory=list)

    def add(self, logits: torch.Tensor, truth: torch.Tensor, own: torch.Tensor | None = None) -> None:
        """Score one batch: logits (b, N, V) at ``truth`` and at the model's ``own`` tokens (b, N; None: its argmax)."""
        z = logits.double()
        z[..., list(self.bans)] = -math.inf
        logp = torch.log_softmax(z, -1)
        own = logp.argmax(-1) if own is None else own
        scored = ~torch.isin(truth, torch.tensor(self.bans, dtype=torch.long))
        self.truth_logp.append(logp.gather(-1, truth[..., None])[..., 0].masked_fill(~scored, 0.0))
        self.own_logp.append(logp.gather(-1, own[..., None])[..., 0])
        self.hit.append(own == truth)
        self.mask.append(scored)

    def reading(self, mode: str) -> Reading:
        """Means over the scored positions (the true token is not banned)."""
        m = torch.cat(self.mask)
        t, o, h = (torch.cat(x)[m] for x in (self.truth_logp, self.own_logp, self.hit))
        per_step = (torch.cat(self.hit) & m).sum(0) / m.sum(0).clamp(min=1)
        return Reading(
            mode,
            positions=int(m.sum()),
            truth_nll=float(-t.mean()),
            accuracy=float(h.double().mean()),
            own_prob=float(o.exp().mean()),
            own_nll=float(-o.mean()),
            accuracy_by_step=per_step.tolist(),
        )


def read_texts(
    subject: Subject, texts: list[list[int]], P: int, N: int, sampler: SamplerConfig | None, mode: str
) -> tuple[Reading, list[list[int]]]:
    """Score the ``N`` tokens after each text's first ``P`` against the text: fed the truth (``sampler`` None: the
    model's own token is its argmax, bans excluded) or generated with ``sampler`` (the generations returned too)."""
    s, out, bs = _Scores(subject.bans), [], subject.cfg.batch_size
    batches: Iterable[tuple[torch.Tensor | None, torch.Tensor | None]] = (
        ((None, subject.logits(texts[i : i + bs])[:, P - 1 : P + N - 1]) for i in range(0, len(texts), bs))
        if sampler is None
        else subject.generate([x[:P] for x in texts], N, sampler, logits=True)
    )
    for b, (tokens, logits) in enumerate(batches):
        truth = torch.tensor([x[P : P + N] for x in texts[b * bs : (b + 1) * bs]], dtype=torch.long)
        assert logits is not None  # asked for
        s.add(logits, truth, tokens)
        out += [] if tokens is None else tokens.tolist()
    return s.reading(mode), out


@dataclass(frozen=True)
class ShadowSummary:
    """The §3.7.2 shadows (Δloss after one true token is replaced) over several texts and positions."""

    texts: int
    window: int
    shadows: list[Shadow]

    def to_dict(self) -> dict:
        """Means over the shadows; the half-life as a median (steps); the mean Δloss curve."""
        sh = self.shadows
        halves = [s.half_life_steps for s in sh if s.half_life_steps is not None]
        curve = [statistics.fmean(s.curve[i] for s in sh) for i in range(self.window)]
        return {
            "texts": self.texts,
            "shadows": len(sh),
            "positions": sorted({s.k for s in sh}),
            "window": self.window,
            "tail_from": TAIL_FROM,
            "mean_next_dloss": r(statistics.fmean(s.next_dloss for s in sh)),
            "mean_peak": r(statistics.fmean(s.peak for s in sh)),
            "mean_tail": r(statistics.fmean(s.tail_mean for s in sh)),
            "median_half_life_steps": statistics.median(halves) if halves else None,
            "mean_curve": [r(x) for x in curve],
        }


def shadows(subject: Subject, texts: list[list[int]]) -> ShadowSummary:
    """:func:`genprobe.experiments.exposure.perturbation` at every position of the config on the first texts."""
    cfg = subject.cfg
    used = texts[: cfg.shadow_texts]
    tok, logits_fn = subject.model.require_tokenizer(), lambda x: subject.logits(x.tolist())  # rows of one length
    with torch.inference_mode():
        out = [
            perturbation(logits_fn, tok, ids, k, cfg.shadow_window, subject.bans)
            for ids in used
            for k in cfg.shadow_positions
            if k + 2 + cfg.shadow_window <= len(ids)
        ]
    if not out:
        raise ValueError(f"no text is long enough for a shadow ({min(cfg.shadow_positions) + 2 + cfg.shadow_window})")
    return ShadowSummary(len(used), cfg.shadow_window, out)


@dataclass(frozen=True)
class Divergence:
    """Greedy continuations of a real prefix and of the same prefix with one token changed, step by step."""

    rows: int
    changed_at: int  # index of the changed token in the prefix
    new_tokens: int
    agree: list[list[bool]]  # per row, per step: the two continuations hold the same token

    def to_dict(self) -> dict:
        """Shares of rows: identical so far / agreeing at each step; never diverged; agreement in the last quarter."""
        n, N = self.rows, self.new_tokens
        # per row, the first step (1-based) whose tokens differ; None when the continuations are identical
        firsts = [next((s + 1 for s, a in enumerate(row) if not a), None) for row in self.agree]
        diverged = sorted(f for f in firsts if f is not None)
        agree_by_step = [sum(row[s] for row in self.agree) / n for s in range(N)]
        identical = [sum(f is None or f > s + 1 for f in firsts) / n for s in range(N)]
        q = max(1, N // 4)
        return {
            "rows": n,
            "changed_at": self.changed_at,
            "new_tokens": N,
            "never_diverged": r(firsts.count(None) / n),
            "median_first_divergence": statistics.median_low(diverged) if len(diverged) * 2 > n else None,
            "tail_agreement": r(statistics.fmean(agree_by_step[-q:])),
            "identical_by_step": [r(x, 3) for x in identical],
            "agreement_by_step": [r(x, 3) for x in agree_by_step],
        }


def divergence(subject: Subject, texts: list[list[int]], clean: list[list[int]], P: int, N: int) -> Divergence:
    """Change prefix token ``P - perturb_back`` to what the model wanted there; greedy again; compare with
    ``clean`` (the greedy continuations of the unchanged prefixes)."""
    c = P - subject.cfg.perturb_back
    prefixes = [x[:P] for x in texts]
    logp = torch.log_softmax(subject.last_logits([x[:c] for x in prefixes]).double(), -1)
    changed = [x[:c] + [wanted_instead(logp[b], x[c], subject.bans)[0]] + x[c + 1 :] for b, x in enumerate(prefixes)]
    bent = torch.cat([t for t, _ in subject.generate(changed, N, subject.sampler(greedy=True))]).tolist()
    agree = [[a == b for a, b in zip(x, y, strict=True)] for x, y in zip(clean, bent, strict=True)]
    return Divergence(len(texts), c, N, agree)


def naive_vs_cached(subject: Subject, prompt_ids: list[list[int]], N: int) -> CacheTiming:
    """Time both modes on the first prompt at each batch size (the case study's :class:`CacheTiming`); generate
    ``match_rows`` prompts both ways and count the rows whose greedy tokens agree."""
    cfg, engine = subject.cfg, subject.runner
    cache = run_cache_timing(engine, prompt_ids[0], N, cfg.timing_batches, cfg.timing_reps, cfg.timing_budget_s)
    few = prompt_ids[: cfg.match_rows]
    naive = generate(engine, few, N, sampler=subject.sampler(greedy=True), mode="naive").tokens
    cached = generate(engine, few, N, sampler=subject.sampler(greedy=True), mode="cached").tokens
    same = sum(a == b for a, b in zip(naive, cached, strict=True))
    return replace(cache, tokens_match={"rows": len(few), "identical": same})


@dataclass
class PhenomenaResult:
    """Every phenomenon on one model (``phenomena.json``)."""

    model: dict
    inputs: dict
    config: PhenomenaConfig
    new_tokens: int  # generated after each prompt
    continuation_tokens: int  # scored after each text's prefix
    diversity: list[DiversityRow]
    distribution: DistributionResult
    readings: list[Reading]
    shadow: ShadowSummary
    divergence: Divergence
    timing: CacheTiming | None
    seconds: dict[str, float]

    def reading(self, mode: str) -> Reading:
        """The reading called ``mode``."""
        return next(x for x in self.readings if x.mode == mode)

    def to_dict(self) -> dict:
        """JSON form (``phenomena.json``): the fields, the readings under ``free_running`` with the prefix length."""
        d = {"format": "genprobe-phenomena/1"} | {f.name: json_safe(getattr(self, f.name)) for f in fields(self)}
        d["free_running"] = {"prefix_tokens": self.config.prefix_tokens, "readings": d.pop("readings")}
        return d | {"seconds": {k: round(v, 1) for k, v in self.seconds.items()}}


def chapter_phenomena(
    model: Model,
    prompts: Sequence[str] | None = None,
    texts: Sequence[str] | None = None,
    *,
    corpus: str = "auto",
    config: PhenomenaConfig | None = None,
    timing: bool = True,
    sources: dict | None = None,
    out: str | Path | None = None,
    log: Callable[[str], None] = lambda msg: None,
) -> PhenomenaResult:
    """Every phenomenon of the module doc on ``model``: ``prompts`` are continued, ``texts`` (real text, at least
    ``prefix_tokens`` + a few tokens each) are read and continued.

    ``prompts`` / ``texts`` default to ``config.max_texts`` inputs held out from the model's ``corpus`` ("tang",
    "english" — the Lee corpus, fetched once by ``genprobe fetch english`` — or "auto"); ``sources`` is recorded
    beside them. With ``out``, writes phenomena.json there.
    """
    cfg = config or PhenomenaConfig()
    inp = choose_inputs(model, prompts, texts, corpus, cfg.max_texts)
    subject = Subject(model, cfg)
    prompt_ids = [subject.encode(p) for p in inp.prompts]
    if not prompt_ids or any(not x for x in prompt_ids):
        raise ValueError("give at least one prompt, none encoding to zero tokens")
    n_gen = subject.fit(cfg.max_new_tokens, max(len(x) for x in prompt_ids))
    P = cfg.prefix_tokens
    n_cont = subject.fit(cfg.max_new_tokens, P)
    text_ids = [w for _, w in token_windows(subject.encode, inp.texts, P + n_cont, cfg.max_texts)]  # cut to length
    if not text_ids:
        raise ValueError(f"no text holds {P + n_cont} tokens (prefix + continuation); give longer texts")
    clock, seconds = time.perf_counter(), {}

    def tick(name: str) -> None:
        nonlocal clock
        seconds[name] = time.perf_counter() - clock
        clock = time.perf_counter()
        log(f"phenomena: {name} done in {seconds[name]:.1f} s")

    div_rows = diversity(subject, prompt_ids, n_gen)
    tick("diversity")
    dist = distribution(subject.last_logits(prompt_ids))
    tick("distribution")
    tf, _ = read_texts(subject, text_ids, P, n_cont, None, "teacher forcing")
    greedy, clean = read_texts(subject, text_ids, P, n_cont, subject.sampler(greedy=True), "free running, greedy")
    tau_1 = subject.sampler(temperature=FREE_TAU)
    sampled, _ = read_texts(subject, text_ids, P, n_cont, tau_1, "free running, τ = 1")
    tick("free_running")
    shadow = shadows(subject, text_ids)
    div = divergence(subject, text_ids, clean, P, n_cont)
    tick("perturbation")
    times = naive_vs_cached(subject, prompt_ids, n_gen) if timing else None
    tick("timing")
    given = {"prompts": len(prompt_ids), "first_prompts": inp.prompts[:3], "texts": len(text_ids)}
    inputs = given | {"texts_given": len(inp.texts), **(sources or {}), **inp.sources}
    result = PhenomenaResult(
        model.describe(), inputs, cfg, n_gen, n_cont, div_rows, dist, [tf, greedy, sampled], shadow, div, times, seconds
    )
    if out is not None:  # the atomic write creates the directory
        atomic_write_json(Path(out) / "phenomena.json", json_safe(result))
    return result
