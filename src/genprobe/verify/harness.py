"""Cache-equivalence harness: compare an implementation's logits with full recomputation, step by step.

A KV cache is a mathematical identity (seed §3.4.2), so the test compares *logits*, not text
(§3.9.1: a missing mask moved logits by 2.10 and the greedy text by 0 characters). Four
comparisons, each able to see a different class of bug:

* **prefill** — the prompt in one cached call vs one uncached forward: should be bit-identical
  (same code path, §3.4.9), reported as ``torch.equal`` and max |Δ|.
* **incremental** — greedy decoding for N steps, teacher-forced with the *reference's* greedy tokens,
  so each step's logits are compared on the very same prefix (step 0 = prefill, step k = k-th
  ``step()``); the implementation is also run free on its own argmax to count text divergences.
* **chunk_c** — the reference's greedy sequence fed in chunks of c tokens (T_new > 1 is where a
  missing causal mask shows, §3.9.4).
* **padded_batch** — prompts of different lengths left-padded into one batch vs each alone
  (where wrong absolute positions show, the GPT-2 ``position_ids`` bug class).

Verdict on the seed's scale (§3.4.3): < 1e-4 float noise (pass), < 1e-3 small, ≤ 1 suspicious,
> 1 bug — all thresholds configurable.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import torch

VERDICTS = ("pass", "small", "suspicious", "bug")


@dataclass(frozen=True)
class Thresholds:
    """Verdict scale for max |Δlogit|: < noise pass, < suspicious small, ≤ bug suspicious, > bug bug."""

    noise: float = 1e-4
    bug: float = 1.0
    suspicious: float = 1e-3
    exact_prefill: bool = False  # when True a prefill that is not bit-identical is at least "small"

    def __post_init__(self) -> None:
        if not (0.0 <= self.noise <= self.suspicious <= self.bug):
            raise ValueError(
                f"thresholds must satisfy 0 <= noise <= suspicious <= bug, got noise={self.noise}, "
                f"suspicious={self.suspicious}, bug={self.bug}"
            )

    def verdict(self, max_abs_dlogit: float) -> str:
        """Classify one max |Δlogit| on the seed's scale."""
        d = float(max_abs_dlogit)
        if d != d or d > self.bug:  # NaN counts as a bug
            return "bug"
        if d >= self.suspicious:
            return "suspicious"
        if d >= self.noise:
            return "small"
        return "pass"

    def to_dict(self) -> dict:
        """JSON form."""
        return asdict(self)


@dataclass
class PhaseResult:
    """One comparison: ``first_*_step`` index the calls (0 = prefill call, k = k-th step/chunk)."""

    phase: str
    max_abs_dlogit: float = 0.0
    bit_identical: bool = True
    first_any_diff_step: int | None = None
    first_diff_step: int | None = None
    calls: int = 0
    skipped: str | None = None

    def to_dict(self) -> dict:
        """JSON form."""
        return asdict(self)


@dataclass
class VerifyReport:
    """Everything the harness measured for one implementation."""

    impl: str
    steps: int
    prompt_lengths: list[int]
    phases: list[PhaseResult]
    prefill_bit_identical: bool
    max_abs_dlogit: float
    first_any_diff_step: int | None
    first_diff_step: int | None
    text_divergences: int
    text_tokens: int
    first_text_divergence: int | None
    text_only_would_catch: bool
    verdict: str
    thresholds: Thresholds
    texts: list[dict] = field(default_factory=list)  # per prompt: reference vs implementation greedy ids

    def phase(self, name: str) -> PhaseResult:
        """The result of phase ``name`` (KeyError if it was not run)."""
        for p in self.phases:
            if p.phase == name:
                return p
        raise KeyError(f"no phase {name!r}; have {[p.phase for p in self.phases]}")

    def max_by_phase(self) -> dict[str, float | None]:
        """max |Δlogit| per phase (None for skipped phases)."""
        return {p.phase: (None if p.skipped else p.max_abs_dlogit) for p in self.phases}

    @property
    def worst_phase(self) -> str:
        """The phase with the largest max |Δlogit|."""
        run = [p for p in self.phases if not p.skipped]
        return max(run, key=lambda p: p.max_abs_dlogit).phase

    @property
    def greedy_max_abs_dlogit(self) -> float:
        """max |Δ| over prefill + incremental only: the quantity of the seed's §3.9.1 table."""
        return max(self.phase("prefill").max_abs_dlogit, self.phase("incremental").max_abs_dlogit)

    @property
    def passed(self) -> bool:
        """True when the verdict is float noise."""
        return self.verdict == "pass"

    def to_dict(self) -> dict:
        """JSON form."""
        d = asdict(self)
        d["max_abs_dlogit_by_phase"] = self.max_by_phase()
        d["passed"] = self.passed
        d["worst_phase"] = self.worst_phase
        d["greedy_max_abs_dlogit"] = self.greedy_max_abs_dlogit
        return d


# ---- reference trajectories --------------------------------------------------------------------------
@dataclass
class ReferenceTrajectory:
    """The reference's greedy run on one prompt: step logits, chosen tokens, full-sequence logits."""

    prompt: list[int]
    prefill_logits: torch.Tensor  # (P, V): every prompt position
    step_logits: list[torch.Tensor]  # N+1 vectors (V,): step 0 = last prompt position, step k after k tokens
    tokens: list[int]  # N+1 greedy tokens chosen from step_logits
    seq_logits: torch.Tensor  # (P+N, V): one uncached forward over prompt + tokens[:N]


class ReferenceRun:
    """Reference trajectories for a set of prompts, computed once and shared by many implementations."""

    def __init__(self, reference: Any, steps: int):
        if not callable(getattr(reference, "full", None)):
            raise ValueError(f"reference {type(reference).__name__} has no full(ids, attention_mask=None) method")
        if steps < 0:
            raise ValueError(f"steps must be >= 0, got {steps}")
        self.reference = reference
        self.steps = steps
        self.max_positions = getattr(reference, "max_positions", None)
        self._runs: dict[tuple[int, ...], ReferenceTrajectory] = {}

    @torch.no_grad()
    def _full(self, ids: list[int]) -> torch.Tensor:
        x = torch.tensor([ids], dtype=torch.long)
        out = self.reference.full(x)
        _check_logits(out, (1, len(ids)), "reference.full")
        return out[0].float()

    def trajectory(self, prompt: Sequence[int]) -> ReferenceTrajectory:
        """Greedy reference run on ``prompt`` (cached)."""
        key = tuple(int(t) for t in prompt)
        if key in self._runs:
            return self._runs[key]
        if not key:
            raise ValueError("empty prompt: the harness needs at least one token per prompt")
        need = len(key) + self.steps
        if self.max_positions is not None and need > self.max_positions:
            raise ValueError(
                f"prompt of {len(key)} tokens + {self.steps} steps needs {need} positions but the model's "
                f"context length is {self.max_positions}: shorten the prompt or lower --steps"
            )
        seq = list(key)
        prefill = self._full(seq)
        step_logits = [prefill[-1]]
        tokens = [int(prefill[-1].argmax())]
        for _ in range(self.steps):
            seq.append(tokens[-1])
            last = self._full(seq)[-1]
            step_logits.append(last)
            tokens.append(int(last.argmax()))
        seq_logits = self._full(seq) if self.steps else prefill
        traj = ReferenceTrajectory(list(key), prefill, step_logits, tokens, seq_logits)
        self._runs[key] = traj
        return traj


# ---- comparisons -------------------------------------------------------------------------------------
def _check_logits(x: Any, lead: tuple[int, int], where: str) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 3 or tuple(x.shape[:2]) != tuple(lead):
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{where} returned {shape}; expected logits of shape ({lead[0]}, {lead[1]}, vocab)")


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| where equal entries (including equal infinities) count 0 and NaN counts +inf."""
    a, b = a.float(), b.float()
    if a.shape != b.shape:
        raise ValueError(f"cannot compare logits of shapes {tuple(a.shape)} and {tuple(b.shape)}")
    d = torch.where(a == b, torch.zeros_like(a), (a - b).abs())
    d = torch.nan_to_num(d, nan=float("inf"), posinf=float("inf"))
    return float(d.max()) if d.numel() else 0.0


class _Tracker:
    """Accumulates one phase: max |Δ|, bit identity and the first call that differs."""

    def __init__(self, phase: str, noise: float):
        self.r = PhaseResult(phase)
        self.noise = noise

    def add(self, call: int, got: torch.Tensor, ref: torch.Tensor) -> None:
        d = max_abs_diff(got, ref)
        self.r.calls += 1
        self.r.max_abs_dlogit = max(self.r.max_abs_dlogit, d)
        if d > 0:  # exact: equal entries count 0, so any bit difference is > 0
            self.r.bit_identical = False
            if self.r.first_any_diff_step is None:
                self.r.first_any_diff_step = call
        if d >= self.noise and self.r.first_diff_step is None:
            self.r.first_diff_step = call


def _first(*xs: int | None) -> int | None:
    xs2 = [x for x in xs if x is not None]
    return min(xs2) if xs2 else None


def _t(ids: Sequence[int]) -> torch.Tensor:
    return torch.tensor([list(ids)], dtype=torch.long)


@torch.no_grad()
def _greedy_phases(impl: Any, trajs: list[ReferenceTrajectory], noise: float) -> tuple[_Tracker, _Tracker]:
    """Prefill (step 0) and teacher-forced incremental decoding (steps 1..N)."""
    pre, inc = _Tracker("prefill", noise), _Tracker("incremental", noise)
    for tr in trajs:
        impl.reset()
        out = impl.prefill(_t(tr.prompt))
        _check_logits(out, (1, len(tr.prompt)), "prefill")
        pre.add(0, out[0], tr.prefill_logits)
        for k in range(1, len(tr.step_logits)):
            out = impl.step(_t([tr.tokens[k - 1]]))
            _check_logits(out, (1, 1), "step")
            inc.add(k, out[0, -1], tr.step_logits[k])
    return pre, inc


@torch.no_grad()
def _free_text(impl: Any, tr: ReferenceTrajectory) -> list[int]:
    """The implementation's own greedy tokens (N+1 of them), fed back to itself."""
    impl.reset()
    out = impl.prefill(_t(tr.prompt))
    toks = [int(out[0, -1].argmax())]
    for _ in range(len(tr.tokens) - 1):
        out = impl.step(_t([toks[-1]]))
        toks.append(int(out[0, -1].argmax()))
    return toks


@torch.no_grad()
def _chunk_phase(impl: Any, trajs: list[ReferenceTrajectory], chunk: int, noise: float) -> _Tracker:
    """The reference's whole greedy sequence fed in chunks of ``chunk`` tokens."""
    tr_ = _Tracker(f"chunk_{chunk}", noise)
    for tr in trajs:
        seq = tr.prompt + tr.tokens[:-1]
        impl.reset()
        for call, start in enumerate(range(0, len(seq), chunk)):
            piece = seq[start : start + chunk]
            out = impl.prefill(_t(piece)) if call == 0 else impl.step(_t(piece))
            _check_logits(out, (1, len(piece)), f"chunk_{chunk} call {call}")
            tr_.add(call, out[0], tr.seq_logits[start : start + len(piece)])
    return tr_


def padded_prompts(prompts: list[list[int]]) -> list[list[int]]:
    """Prompts for the padded batch: the given ones, plus a shorter suffix when all lengths are equal."""
    if len({len(p) for p in prompts}) > 1:
        return prompts
    p = prompts[0]
    if len(p) < 2:  # nothing shorter to pad: the batch is just the prompts
        return prompts
    return prompts + [p[len(p) // 2 :]]


@torch.no_grad()
def _padded_phase(impl: Any, run: ReferenceRun, prompts: list[list[int]], noise: float, pad_id: int) -> _Tracker:
    """Left-padded batch (prefill + teacher-forced decode) vs each prompt alone."""
    tr_ = _Tracker("padded_batch", noise)
    trajs = [run.trajectory(p) for p in prompts]
    L = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), L), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), L), dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, L - len(p) :] = torch.tensor(p)
        mask[b, L - len(p) :] = 1
    impl.reset()
    try:
        out = impl.prefill(ids, attention_mask=mask)
    except NotImplementedError as exc:
        tr_.r.skipped = f"implementation does not support padding ({exc or 'NotImplementedError'})"
        return tr_
    _check_logits(out, (len(prompts), L), "padded prefill")
    got = torch.cat([out[b, L - len(p) :] for b, p in enumerate(prompts)])
    tr_.add(0, got, torch.cat([t.prefill_logits for t in trajs]))
    for k in range(1, run.steps + 1):
        out = impl.step(torch.tensor([[t.tokens[k - 1]] for t in trajs], dtype=torch.long))
        _check_logits(out, (len(prompts), 1), "padded step")
        tr_.add(k, out[:, -1], torch.stack([t.step_logits[k] for t in trajs]))
    return tr_


def verify_implementation(
    impl: Any,
    reference: Any,
    prompts: list[list[int]],
    steps: int = 50,
    chunk_sizes: Sequence[int] = (1, 4),
    padded_batch: bool = True,
    thresholds: Thresholds | None = None,
    name: str | None = None,
    pad_id: int = 0,
) -> VerifyReport:
    """Compare ``impl`` with full recomputation (a reference or a shared :class:`ReferenceRun`)."""
    th = thresholds or Thresholds()
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("prompts must be a non-empty list of non-empty token-id lists")
    if any(int(c) < 1 for c in chunk_sizes):
        raise ValueError(f"chunk sizes must be >= 1, got {list(chunk_sizes)}")
    from .adapters import check_impl

    check_impl(impl)
    run = reference if isinstance(reference, ReferenceRun) else ReferenceRun(reference, steps)
    if run.steps != steps:
        raise ValueError(f"the shared ReferenceRun was computed for {run.steps} steps, not {steps}")
    impl_max = getattr(impl, "max_positions", None)
    need = max(len(p) for p in prompts) + steps
    if impl_max is not None and need > impl_max:
        raise ValueError(
            f"{need} positions needed but the implementation's context length is {impl_max}: "
            "shorten the prompts or lower --steps"
        )
    prompts = [[int(t) for t in p] for p in prompts]
    trajs = [run.trajectory(p) for p in prompts]

    pre, inc = _greedy_phases(impl, trajs, th.noise)
    phases = [pre.r, inc.r]
    for c in chunk_sizes:
        phases.append(_chunk_phase(impl, trajs, int(c), th.noise).r)
    if padded_batch:
        phases.append(_padded_phase(impl, run, padded_prompts(prompts), th.noise, pad_id).r)

    texts, divergences, first_div, total = [], 0, None, 0
    for tr in trajs:
        own = _free_text(impl, tr)
        diff = [i for i, (a, b) in enumerate(zip(own, tr.tokens)) if a != b]
        divergences += len(diff)
        total += len(own)
        if diff:
            first_div = diff[0] if first_div is None else min(first_div, diff[0])
        texts.append({"prompt": tr.prompt, "reference": tr.tokens, "implementation": own})

    overall = max(p.max_abs_dlogit for p in phases if not p.skipped)
    verdict = th.verdict(overall)
    if th.exact_prefill and not pre.r.bit_identical and verdict == "pass":
        verdict = "small"
    return VerifyReport(
        impl=name or getattr(impl, "name", None) or type(impl).__name__,
        steps=steps,
        prompt_lengths=[len(p) for p in prompts],
        phases=phases,
        prefill_bit_identical=pre.r.bit_identical,
        max_abs_dlogit=overall,
        first_any_diff_step=_first(pre.r.first_any_diff_step, inc.r.first_any_diff_step),
        first_diff_step=_first(pre.r.first_diff_step, inc.r.first_diff_step),
        text_divergences=divergences,
        text_tokens=total,
        first_text_divergence=first_div,
        text_only_would_catch=divergences > 0,
        verdict=verdict,
        thresholds=th,
        texts=texts,
    )
