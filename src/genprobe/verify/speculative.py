"""Is speculative decoding the target model's decoding? Greedy: token for token; sampled: in distribution.

Three checks, each a typed result with a verdict (``pass``, ``bug``, ``error`` or ``not checked``):
:func:`greedy_check`, :func:`exact_check` (every random choice of the real decoder enumerated; total variation) and
:func:`two_sample_check` (χ² and z-tests on samples); :data:`MUTANTS`: broken decoders, each overriding one rule of
:class:`~genprobe.engine.speculative.SpeculativeDecoder`. docs/speculative.md describes each check and its tolerances.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from .._io import json_safe
from ..engine.generate import generate
from ..engine.runner import runner_for
from ..engine.samplers.chain import process_logits
from ..engine.samplers.stages import SamplerConfig
from ..engine.speculative import CachedModel, SeededDraws, SpeculativeDecoder, SpeculativeStats, check_k, make_draft
from ..model.load import load_model
from .api import encode_prompts
from .reuse import random_ids

EXACT_TOLERANCE = 1e-4
EXACT_SAMPLER = SamplerConfig(temperature=1.0, top_k=3)
NOT_CHECKED = "not checked"


# ---- greedy: token identity ---------------------------------------------------------------------------------
@dataclass
class GreedyCheck:
    """Speculative greedy vs plain greedy on each prompt."""

    verdict: str
    prompts: int
    tokens: int
    identical_prompts: int
    first_divergence: dict[str, int] | None  # prompt, position, plain, speculative
    stats: dict[str, Any]
    error: str | None = None


def greedy_check(
    target: Any,
    draft: Any,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    k: int,
    decoder: type[SpeculativeDecoder] = SpeculativeDecoder,
) -> GreedyCheck:
    """Every prompt decoded greedily both ways; ``pass`` when every token agrees."""
    total, same, first, stats = 0, 0, None, SpeculativeStats()
    error: str | None = None
    try:
        for i, prompt in enumerate(prompts):
            plain = generate(target, [list(prompt)], max_new_tokens).tokens[0]
            spec = decoder(target, draft, k).run(prompt, max_new_tokens)
            _add(stats, spec.stats)
            total += len(plain)
            diffs = (j for j, (a, b) in enumerate(zip(plain, spec.tokens, strict=False)) if a != b)
            pos = next(diffs, None if len(plain) == len(spec.tokens) else min(len(plain), len(spec.tokens)))
            if pos is None:
                same += 1
            elif first is None:
                at = [[*seq, -1][pos] for seq in (plain, spec.tokens)]  # -1: the run ended before
                first = {"prompt": i, "position": pos, "plain": at[0], "speculative": at[1]}
    except (ValueError, RuntimeError, IndexError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    verdict = "error" if error else "pass" if first is None else "bug"
    return GreedyCheck(verdict, len(prompts), total, same, first, json_safe(stats), error)


def _add(total: SpeculativeStats, one: SpeculativeStats) -> None:
    for name in ("rounds", "drafted", "accepted", "tokens", "draft_forwards", "seconds"):
        setattr(total, name, getattr(total, name) + getattr(one, name))


# ---- sampled, exactly: enumerate every random choice ---------------------------------------------------------
class _Branch(Exception):
    """Raised by :class:`ScriptedDraws` at the first choice past its script: the options to explore."""

    def __init__(self, options: list[tuple[Any, float]]):
        super().__init__("branch")
        self.options = options


class ScriptedDraws:
    """Draws that follow a script of (choice, probability); past its end they raise :class:`_Branch`."""

    def __init__(self, script: Sequence[tuple[Any, float]]):
        self.script, self.at, self.weight = script, 0, 1.0

    def _choose(self, options: list[tuple[Any, float]]) -> Any:
        if self.at == len(self.script):
            raise _Branch(options)
        choice, prob = self.script[self.at]
        self.at += 1
        self.weight *= prob
        return choice

    def token(self, probs: torch.Tensor) -> int:
        p = probs.double().cpu()
        return int(self._choose([(int(i), float(p[i])) for i in (p > 0).nonzero().flatten()]))

    def coin(self, prob: float) -> bool:
        options = [(True, prob), (False, 1.0 - prob)]
        return bool(self._choose([(c, w) for c, w in options if w > 0]))


@dataclass
class ExactCheck:
    """The exact distribution of the first ``tokens`` speculative tokens vs the target's."""

    JSON_PROPERTIES = ("margin",)  # computed from the fields, kept in the JSON form

    verdict: str
    tokens: int
    k: int
    sampler: dict[str, Any]
    total_variation: float | None
    tolerance: float
    sequences: int  # sequences with positive probability (either side)
    runs: int  # replays of the decoder
    drafted: int  # draft tokens proposed over the whole tree (0: nothing speculative was looked at)
    worst: dict[str, Any] | None  # the sequence with the largest |Δp|
    error: str | None = None

    @property
    def margin(self) -> float | None:
        """tolerance / TV for a pass (how far below), TV / tolerance otherwise (how far above)."""
        tv = self.total_variation
        if tv is None:
            return None
        if self.verdict == "pass":
            return math.inf if tv == 0 else self.tolerance / tv
        return tv / self.tolerance


def speculative_distribution(
    make: Callable[[ScriptedDraws], SpeculativeDecoder], prompt: Sequence[int], n: int, max_runs: int = 50_000
) -> tuple[dict[tuple[int, ...], float], int, int]:
    """(P(first ``n`` tokens) of the decoder ``make`` builds, replays run, draft tokens proposed), by enumeration."""
    dist: dict[tuple[int, ...], float] = defaultdict(float)
    stack: list[list[tuple[Any, float]]] = [[]]
    runs = drafted = 0
    while stack:
        script = stack.pop()
        runs += 1
        if runs > max_runs:
            raise ValueError(f"more than {max_runs} branches: use fewer tokens, a smaller k or a smaller top-k")
        draws = ScriptedDraws(script)
        decoder = make(draws)
        try:
            result = decoder.run(prompt, n)
        except _Branch as branch:
            stack.extend([*script, option] for option in branch.options)
            continue
        drafted += result.stats.drafted
        dist[tuple(result.tokens)] += draws.weight
    return dict(dist), runs, drafted


def target_distribution(target: Any, prompt: Sequence[int], n: int, cfg: SamplerConfig) -> dict[tuple[int, ...], float]:
    """P(first ``n`` tokens) under plain sampling, each step from full recomputation of the whole context."""
    runner, P, dist = runner_for(target), len(prompt), {}
    stack: list[tuple[list[int], float]] = [([], 1.0)]
    with torch.inference_mode():
        while stack:
            new, weight = stack.pop()
            if len(new) == n:
                dist[tuple(new)] = weight
                continue
            ids = torch.tensor([[*prompt, *new]], dtype=torch.long)
            logits = runner.full(ids, torch.ones_like(ids, dtype=torch.bool))[0, -1].float().cpu()
            hist = ids if cfg.uses_history else None
            p = torch.softmax(process_logits(logits[None], hist, cfg, prompt_len=P)[0], -1).double()
            for t in (p > 0).nonzero().flatten().tolist():
                stack.append(([*new, t], weight * float(p[t])))
    return dist


def exact_check(
    target: Any,
    draft: Any,
    prompt: Sequence[int],
    n: int = 3,
    k: int = 1,
    sampler: SamplerConfig | None = None,
    decoder: type[SpeculativeDecoder] = SpeculativeDecoder,
    tolerance: float = EXACT_TOLERANCE,
) -> ExactCheck:
    """Total variation between the speculative and the target distributions of the first ``n`` tokens."""
    cfg = sampler or EXACT_SAMPLER
    if cfg.greedy:
        raise ValueError("the exact distribution check needs a sampling sampler (greedy has one outcome)")
    try:
        spec, runs, drafted = speculative_distribution(lambda d: decoder(target, draft, k, cfg, d), prompt, n)
    except (ValueError, RuntimeError, IndexError) as exc:
        return ExactCheck("error", n, k, cfg.to_dict(), None, tolerance, 0, 0, 0, None, f"{type(exc).__name__}: {exc}")
    ref = target_distribution(target, prompt, n, cfg)
    keys = set(spec) | set(ref)
    diffs = {s: spec.get(s, 0.0) - ref.get(s, 0.0) for s in keys}
    tv = 0.5 * sum(abs(d) for d in diffs.values())
    worst_seq = max(diffs, key=lambda s: abs(diffs[s]))
    worst = {"tokens": list(worst_seq), "speculative": spec.get(worst_seq, 0.0), "target": ref.get(worst_seq, 0.0)}
    verdict = NOT_CHECKED if drafted == 0 else ("pass" if tv <= tolerance else "bug")
    return ExactCheck(verdict, n, k, cfg.to_dict(), tv, tolerance, len(keys), runs, drafted, worst)


# ---- sampled, statistically: two samples ------------------------------------------------------------------
@dataclass
class TwoSampleCheck:
    """Plain vs speculative samples of the first ``tokens`` tokens, position by position."""

    verdict: str
    samples: int
    tokens: int
    p_value: float | None  # Bonferroni-adjusted, over every test
    alpha: float
    power: float
    min_detectable_shift: float  # of one token's probability (near 1/2, the hardest case), at ``power``
    tests: list[dict[str, Any]] = field(default_factory=list)
    acceptance_rate: float | None = None


def two_sample_check(
    target: Any,
    draft: Any,
    prompt: Sequence[int],
    n: int,
    k: int,
    sampler: SamplerConfig,
    samples: int,
    seed: int = 0,
    alpha: float = 0.01,
    decoder: type[SpeculativeDecoder] = SpeculativeDecoder,
) -> TwoSampleCheck:
    """``samples`` plain (one batch) and ``samples`` speculative generations; ``bug`` when the adjusted p < alpha."""
    if samples < 20:
        raise ValueError(f"the two-sample test needs at least 20 samples per side, got {samples}")
    plain = generate(target, [list(prompt)] * samples, n, sampler=sampler, seed=seed).tokens
    stats, spec = SpeculativeStats(), []
    for i in range(samples):
        run = decoder(target, draft, k, sampler, SeededDraws(seed + 1 + i)).run(prompt, n)
        spec.append(run.tokens)
        _add(stats, run.stats)
    tests: list[dict[str, Any]] = []
    for pos in range(n):
        a = Counter(row[pos] for row in plain if len(row) > pos)
        b = Counter(row[pos] for row in spec if len(row) > pos)
        tests.append({"position": pos, "test": "chi2", **_chi2(a, b)})
        tests.append({"position": pos, "test": "z_top_token", **_z_top(a, b)})
    m = len(tests)
    p_adj = min(1.0, m * min(float(t["p_value"]) for t in tests))
    power, normal = 0.8, statistics.NormalDist()
    z = normal.inv_cdf(1 - alpha / (2 * m)) + normal.inv_cdf(power)
    shift = z * math.sqrt(2 * 0.25 / samples)  # two proportions near 1/2: the largest variance
    verdict = "pass" if p_adj >= alpha else "bug"
    return TwoSampleCheck(verdict, samples, n, p_adj, alpha, power, shift, tests, stats.acceptance_rate)


def _chi2(a: Counter[int], b: Counter[int]) -> dict[str, float]:
    """χ² homogeneity of two count tables; tokens with fewer than 10 counts together are pooled."""
    na, nb = sum(a.values()), sum(b.values())
    cells: list[tuple[float, float]] = []
    rest = [0.0, 0.0]
    for t in set(a) | set(b):
        if a[t] + b[t] >= 10:
            cells.append((a[t], b[t]))
        else:
            rest[0], rest[1] = rest[0] + a[t], rest[1] + b[t]
    if sum(rest):
        cells.append((rest[0], rest[1]))
    if len(cells) < 2:
        return {"statistic": 0.0, "df": 0, "p_value": 1.0}
    stat = 0.0
    for x, y in cells:
        tot = x + y
        for obs, n in ((x, na), (y, nb)):
            exp = tot * n / (na + nb)
            stat += (obs - exp) ** 2 / exp
    df = len(cells) - 1
    p = float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2)))
    return {"statistic": stat, "df": df, "p_value": p}


def _z_top(a: Counter[int], b: Counter[int]) -> dict[str, float]:
    """Two-proportion z-test on the token commonest in both samples together."""
    na, nb = sum(a.values()), sum(b.values())
    top = (a + b).most_common(1)[0][0]
    pa, pb, pool = a[top] / na, b[top] / nb, (a[top] + b[top]) / (na + nb)
    se = math.sqrt(pool * (1 - pool) * (1 / na + 1 / nb))
    z = 0.0 if se == 0 else (pa - pb) / se
    return {"token": top, "plain": pa, "speculative": pb, "z": z, "p_value": math.erfc(abs(z) / math.sqrt(2))}


# ---- mutants: docs/speculative.md tables them with the check that catches each ---------------------------------
class AcceptIfPGeQ(SpeculativeDecoder):
    """Deterministic acceptance: a draft is kept iff the target gives it at least the draft's probability."""

    def accept_prob(self, p: torch.Tensor, q: torch.Tensor, x: int) -> float:
        return 1.0 if float(p[x]) >= float(q[x]) else 0.0


class ResidualFromP(SpeculativeDecoder):
    """After a rejection the replacement is drawn from p itself (the rejected token can come back)."""

    def residual(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return p


class DroppedBonus(SpeculativeDecoder):
    """The bonus token after k acceptances is fed to the models but never emitted."""

    def commit(self, context: list[int], out: list[int], kept: list[int], token: int, bonus: bool) -> None:
        context.extend([*kept, token])
        out.extend(kept if bonus else [*kept, token])


class DoubledBonus(SpeculativeDecoder):
    """The bonus token is appended twice (emitted once per bookkeeping path)."""

    def commit(self, context: list[int], out: list[int], kept: list[int], token: int, bonus: bool) -> None:
        new = [*kept, token, token] if bonus else [*kept, token]
        context.extend(new)
        out.extend(new)


class NoRollback(SpeculativeDecoder):
    """The bookkeeping forgets the rejected drafts, the caches keep them (their keys stay visible, positions run on)."""

    def rollback(self, context: Sequence[int]) -> None:
        for cached in (self.target, self.draft):
            if isinstance(cached, CachedModel):
                del cached.tokens[cached.keep_for(context) :]


class VerifyOffByOne(SpeculativeDecoder):
    """The verification rows are read one position late: ``d_j`` is judged by the row at ``d_j`` itself."""

    def verify_rows(self, context: Sequence[int], drafted: Sequence[int]) -> torch.Tensor:
        rows = super().verify_rows(context, drafted)
        return torch.cat([rows[1:], rows[-1:]]) if len(drafted) else rows


MUTANTS: dict[str, type[SpeculativeDecoder]] = {
    "correct": SpeculativeDecoder,
    "accept_if_p_ge_q": AcceptIfPGeQ,
    "residual_from_p": ResidualFromP,
    "dropped_bonus": DroppedBonus,
    "doubled_bonus": DoubledBonus,
    "no_rollback": NoRollback,
    "verify_off_by_one": VerifyOffByOne,
}


@dataclass
class MutantRow:
    """One decoder (correct or broken) through the greedy and exact checks."""

    JSON_PROPERTIES = ("caught", "ok")  # computed from the fields, kept in the JSON form

    name: str
    expected: str = field(init=False)  # "pass" (the correct decoder) | "caught"
    greedy: str
    exact: str
    total_variation: float | None
    margin: float | None  # exact check: tolerance/TV for the correct decoder, TV/tolerance for a mutant
    first_divergence: dict[str, int] | None

    def __post_init__(self) -> None:
        self.expected = "pass" if self.name == "correct" else "caught"

    @property
    def caught(self) -> bool:
        return self.greedy in ("bug", "error") or self.exact in ("bug", "error")

    @property
    def ok(self) -> bool:
        """The correct decoder passes both checks; a mutant is caught."""
        return self.greedy == self.exact == "pass" if self.expected == "pass" else self.caught


# ---- the whole verification -------------------------------------------------------------------------------
@dataclass
class SpeculativeVerification:
    """What ``genprobe verify-speculative`` reports (with its ``verdict``, computed from the checks)."""

    model: str
    draft: str
    k: int
    greedy: GreedyCheck
    exact: ExactCheck | None
    two_sample: TwoSampleCheck | None
    mutants: list[MutantRow] | None = None
    JSON_PROPERTIES = ("verdict",)

    @property
    def verdict(self) -> str:
        """``bug`` if a check failed, ``error`` if one raised, ``pass`` when at least one passed, else not checked."""
        checks = [c.verdict for c in (self.greedy, self.exact, self.two_sample) if c is not None]
        return next((bad for bad in ("bug", "error") if bad in checks), "pass" if "pass" in checks else NOT_CHECKED)

    @property
    def mutants_ok(self) -> bool:
        return all(r.ok for r in self.mutants or ())


def default_prompts(vocab_size: int, seed: int = 0) -> list[list[int]]:
    """A loop-prone prompt (a random 6-token pattern, three times and a half) and an ordinary one (16 random ids)."""
    # low ids (3 to 255): byte-level vocabularies put their commonest pieces there
    pattern, ordinary = random_ids(min(vocab_size, 256), [6, 16], seed, lo=3)
    return [pattern * 3 + pattern[:3], ordinary]


def verify_speculative(
    model: Any,
    draft: Any = None,
    *,
    k: int = 4,
    prompts: Sequence[str] | Sequence[Sequence[int]] | None = None,
    max_new_tokens: int = 32,
    exact_tokens: int = 3,
    exact_k: int = 1,
    sampler: SamplerConfig | None = None,
    samples: int = 0,
    seed: int = 0,
    mutants: bool = False,
) -> SpeculativeVerification:
    """Verify genprobe's speculative decoding on ``model`` (a loaded model or a path): greedy identity on every
    prompt, the exact distribution of the first ``exact_tokens`` tokens (on the first prompt, with ``exact_k``
    drafts per round), and with ``samples`` > 0 a two-sample test on ``max(exact_tokens, 4)`` tokens; with
    ``mutants`` the broken decoders too. ``draft``: ``"lookup"``, ``"layers:N"``, a model, or None (the target's
    first half of its layers)."""
    target = load_model(model) if isinstance(model, str) else model
    k = check_k(k)
    check_k(exact_k)
    if exact_tokens < 1:
        raise ValueError(f"exact_tokens must be >= 1, got {exact_tokens}")
    cfg = getattr(target.module, "cfg", None) or getattr(target.module, "config", None)
    layers = getattr(cfg, "n_layer", None) or getattr(cfg, "num_hidden_layers", None) or 2  # default: the first half
    d = make_draft(target, draft if draft is not None else f"layers:{max(1, int(layers) // 2)}")
    cfg = sampler or EXACT_SAMPLER
    ids = default_prompts(runner_for(target).vocab_size, seed) if prompts is None else encode_prompts(target, prompts)
    sampled_prompt = continued(target, ids[0], exact_tokens)
    decoders = MUTANTS if mutants else {"correct": MUTANTS["correct"]}  # the correct decoder's checks are the verdict
    checks = {
        name: (
            greedy_check(target, d, ids, max_new_tokens, k, decoder=decoder),
            exact_check(target, d, sampled_prompt, exact_tokens, exact_k, cfg, decoder=decoder),
        )
        for name, decoder in decoders.items()
    }
    two = None
    if samples:
        two = two_sample_check(target, d, sampled_prompt, max(exact_tokens, 4), k, cfg, samples, seed)
    rows = [
        MutantRow(n, g.verdict, e.verdict, e.total_variation, e.margin, g.first_divergence)
        for n, (g, e) in checks.items()
    ]
    name = getattr(d, "name", "model")
    source = str(getattr(target, "source", model))
    return SpeculativeVerification(source, name, k, *checks["correct"], two, rows if mutants else None)


def continued(target: Any, prompt: Sequence[int], n: int, extra: int = 16) -> list[int]:
    """``prompt`` and its plain greedy continuation (up to ``extra`` tokens, within the context): the sampled checks
    start where the model repeats itself, so that prompt lookup finds what the model would say."""
    limit = runner_for(target).max_positions
    room = extra if limit is None else min(extra, limit - len(prompt) - n - 1)
    if room < 1:
        return list(prompt)
    return [*prompt, *generate(target, [list(prompt)], room).tokens[0]]
