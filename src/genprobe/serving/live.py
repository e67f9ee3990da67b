"""Verify a live server (or any :class:`~genprobe.engine.backend.Backend`) against float32 recomputation (issue #47).

An API returns top-k log-probabilities, not the whole vocabulary, so every comparison is over what was returned: the
sampled token's log-probability and the top-k ids and values at each position, against ``log_softmax`` of one
float32 forward of ``--reference`` over the same prompt + generated ids (:class:`~genprobe.serving.compare.
ReferenceLogprobs`, :func:`~genprobe.serving.compare.compare_values`). Phases, as far as the backend allows:

* ``prompt``: prompt log-probabilities (where offered) — the prefill's numbers;
* ``greedy``: the requests one at a time, greedy — judged on verify-cache's absolute scale
  (:func:`~genprobe.serving.verdict.serving_verdict`: max |Δ log p|, a differing top-1 token at least suspicious);
* ``prefix``: a pair sharing a long prefix, the second sent after the first (prefix cache) — and
  ``concurrency``: the same requests as ``greedy``, ``concurrency`` in flight at once (batch composition). These
  two are judged on the gap ratio of :mod:`~genprobe.serving.precision` over the *same requests served alone*
  (the deployment's own floor, measured on the day): a reduced-precision server is not a bug, a cache or batch
  that changes the numbers is. Reported beside: top-1 agreement, max |Δ log p|, the first token where the greedy
  text differs from the lone run and the rate of such divergences (the nondeterminism users see at temperature 0);
* ``seed``: a sampled request sent twice with the same seed gives the same tokens;
* ``limits``: ``max_tokens`` and a stop sequence honoured;
* ``chat``: the prompt ids the server builds from ``messages`` against the reference's own chat template rendered
  by ``transformers`` (first differing token; a dropped system turn; BOS added or omitted).

A phase the backend cannot support is "not checked" with the reason, never "pass".
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from ..engine.backend import Position, Response
from ..verify.compare import Thresholds
from .compare import LogprobStats, compare_values
from .precision import gap_verdict
from .verdict import serving_verdict, worst_verdict

NOT_CHECKED = "not checked"
WORDS = (
    "the river morning house small light old road winter city quiet people across under bright long water stone "
    "field garden window again before after evening north green story music table letter voice between"
).split()
CHAT = [
    {"role": "system", "content": "You are a careful assistant."},
    {"role": "user", "content": "Name three rivers."},
]


@dataclass
class LivePhase:
    """One phase's figures and verdict ("not checked" with ``note`` saying why)."""

    phase: str
    verdict: str
    judged_on: str = ""  # "f32" | "gap" (over the lone runs) | "tokens" | "template"
    note: str = ""
    requests: int = 0
    positions: int = 0
    max_abs_dlogp: float | None = None
    mean_abs_dlogp: float | None = None
    top1_agreement: float | None = None
    topk_agreement: float | None = None  # mean |served top-k ∩ reference top-k| / k
    gap_ratio: float | None = None
    divergence_rate: float | None = None  # requests whose greedy tokens differ from the lone run
    first_divergence: dict[str, int] | None = None  # {"request": r, "token": t}
    cached_tokens: int | None = None


@dataclass
class LiveReport:
    """Every phase of one live verification."""

    JSON_PROPERTIES = ("verdict",)  # computed from the phases, kept in the JSON form

    url: str
    server: str
    model_name: str
    reference: str
    capabilities: dict[str, Any]
    settings: dict[str, Any]
    phases: list[LivePhase] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        """The worst checked phase's verdict ("not checked" when none was)."""
        checked = [p.verdict for p in self.phases if p.verdict != NOT_CHECKED]
        return worst_verdict(checked) if checked else NOT_CHECKED


@dataclass(frozen=True)
class LiveSettings:
    """What the verifier sends: ``requests`` greedy prompts of ``steps`` tokens, ``top_k`` log-probs per position,
    ``concurrency`` in flight in the concurrency phase."""

    requests: int = 64
    concurrency: int = 8
    steps: int = 16
    top_k: int = 5
    seed: int = 0


def random_prompts(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct seeded word sequences of 6–14 words (text: every server takes it)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 14))).capitalize() for _ in range(n)]


def piece_table(model: Any) -> dict[str, int]:
    """Each token's text → its id, for the pieces exactly one id has (what maps text-keyed log-probs back)."""
    seen: dict[str, list[int]] = {}
    tok = model.tokenizer
    for i in range(len(tok.hf) if hasattr(tok, "hf") else tok.vocab_size):
        seen.setdefault(tok.token_str(i) if hasattr(tok, "token_str") else model.decode([i]), []).append(i)
    return {s: ids[0] for s, ids in seen.items() if len(ids) == 1}


class Judge:
    """Compares responses with float32 recomputation and with each other."""

    def __init__(self, reference: Callable[[Sequence[int]], torch.Tensor], thresholds: Thresholds, k: int):
        self.reference = reference
        self.th = thresholds
        self.k = k

    def stats(self, responses: Sequence[Response], prompt: bool = False) -> tuple[LogprobStats, float | None, float]:
        """(stats, top-k agreement, mean gap) over the generated (or, ``prompt``, the prompt's) positions."""
        stats, overlap, n = LogprobStats(), 0.0, 0
        for r, resp in enumerate(responses):
            rows = self.reference(resp.prompt_ids + resp.token_ids)
            P = len(resp.prompt_ids)
            placed = (
                [(i - 1, i, p) for i, p in enumerate(resp.prompt_positions or []) if p is not None]
                if prompt
                else [(P - 1 + s, s, p) for s, p in enumerate(resp.positions)]
            )
            worst = 0.0
            for row, index, pos in placed:
                entries = _entries(pos)
                if not entries:
                    continue
                ids, lps = list(entries), list(entries.values())
                top = max(pos.top, key=pos.top.__getitem__) if pos.top else pos.token
                where = "prompt" if prompt else "step"
                worst = max(worst, compare_values(stats, ids, lps, top, rows[row], r, where, index, *self._tol))
                if pos.top:
                    k = min(self.k, len(pos.top))  # vLLM adds the sampled / prompt token beside its top k
                    served_top = sorted(pos.top, key=pos.top.__getitem__, reverse=True)[:k]
                    ref_top = set(torch.topk(rows[row], k).indices.tolist())
                    overlap += len(ref_top & set(served_top)) / k
                    n += 1
            stats.per_request_max.append(worst)
        gap = stats.mean_abs_dlogp or 0.0
        return stats, (overlap / n if n else None), gap

    @property
    def _tol(self) -> tuple[float, float]:
        return self.th.noise, self.th.noise

    def absolute(self, name: str, responses: Sequence[Response], prompt: bool = False) -> LivePhase:
        """A phase judged on verify-cache's absolute scale against float32 recomputation."""
        stats, topk, _ = self.stats(responses, prompt)
        if not stats.positions:
            return LivePhase(name, NOT_CHECKED, note="the server returned no log-probabilities to compare")
        verdict = serving_verdict(stats.max_abs_dlogp, stats.top1_disagreements, self.th)
        return _phase(name, verdict, "f32", responses, stats, topk)

    def relative(self, name: str, served: Sequence[Response], alone: Sequence[Response], floor: float) -> LivePhase:
        """A phase judged on its gap to float32 over ``floor`` (the lone requests' gap), with the greedy divergences
        of each served response from its lone run in ``alone``."""
        stats, topk, gap = self.stats(served)
        if not stats.positions:
            return LivePhase(name, NOT_CHECKED, note="the server returned no log-probabilities to compare")
        verdict, ratio = gap_verdict(gap, floor, self.th.noise)
        phase = _phase(name, verdict, "gap", served, stats, topk)
        phase.gap_ratio = ratio
        firsts = [_first_difference(a.token_ids, s.token_ids) for a, s in zip(alone, served, strict=True)]
        diverged = [(r, t) for r, t in enumerate(firsts) if t is not None]
        phase.divergence_rate = len(diverged) / len(served)
        phase.first_divergence = {"request": diverged[0][0], "token": diverged[0][1]} if diverged else None
        return phase


def _entries(pos: Position) -> dict[int, float]:
    """Every (id, log p) a position returned: its top-k and the token itself."""
    out = dict(pos.top)
    if pos.logprob is not None:
        out.setdefault(pos.token, pos.logprob)
    return out


def _phase(name: str, verdict: str, on: str, responses: Sequence[Response], s: LogprobStats, topk) -> LivePhase:
    cached = [r.cached_tokens for r in responses if r.cached_tokens is not None]
    return LivePhase(
        name,
        verdict,
        on,
        requests=len(responses),
        positions=s.positions,
        max_abs_dlogp=s.max_abs_dlogp,
        mean_abs_dlogp=s.mean_abs_dlogp,
        top1_agreement=s.top1_agreement,
        topk_agreement=topk,
        cached_tokens=max(cached) if cached else None,
    )


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """First index where ``a`` and ``b`` differ (a length difference counts), None when equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
