"""Cache-equivalence harness: an implementation's logits (not text: chapter §3.9.1) vs full recomputation, phase by
phase. The phases and the class of bug each can see: docs/verify-cache.md ("Reference"). An exception inside the
implementation makes its phase ``error`` and the harness moves on to the next phase.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import torch

from ..engine.runner import left_padded
from .adapters import check_impl
from .compare import Thresholds
from .report import PhaseTracker, VerifyReport, max_abs_diff, overall_verdict
from .reuse import DECODE, REUSE_LENGTH, ReuseCase, random_ids, reuse_cases, situations

if TYPE_CHECKING:  # pragma: no cover
    from .adapters import CacheImpl, Reference


# ---- reference trajectories --------------------------------------------------------------------------
@dataclass
class ReferenceTrajectory:
    """The reference's greedy run on one prompt: step logits, chosen tokens, full-sequence logits."""

    prompt: list[int]
    prefill_logits: torch.Tensor  # (P, V): every prompt position
    step_logits: list[torch.Tensor]  # N+1 vectors (V,): step 0 = last prompt position, step k after k tokens
    tokens: list[int]  # N+1 greedy tokens chosen from step_logits
    seq_logits: torch.Tensor  # (P+N, V): one uncached forward over prompt + tokens[:N]
    steps: int  # N
    vocab: int  # V


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
        self.name = getattr(reference, "description", None) or "full recomputation"
        self._runs: dict[tuple[int, ...], ReferenceTrajectory] = {}
        self._seqs: dict[tuple[int, ...], torch.Tensor] = {}
        self._floors: dict[tuple[tuple[int, ...], ...], dict[str, Any]] = {}

    @torch.no_grad()
    def _full(self, ids: list[int]) -> torch.Tensor:
        x = torch.tensor([ids], dtype=torch.long)
        out: torch.Tensor = self.reference.full(x)
        _check_logits(out, (1, len(ids), None), "reference.full")
        return out[0].float()

    def logits(self, seq: Sequence[int]) -> torch.Tensor:
        """(T, V) logits of every position of ``seq`` in one uncached forward (memoised)."""
        key = tuple(int(t) for t in seq)
        if key not in self._seqs:
            self._seqs[key] = self._full(list(key))
        return self._seqs[key]

    def noise_floor(self, prompts: list[list[int]], pad_id: int = 0) -> dict[str, Any]:
        """The reference's own float noise on these prompts, ``{"value", "sources": {how: max |Δlogit|}}``: the same
        logits computed twice in another order (``prefix_vs_whole``, and ``batched_vs_solo`` unless the reference takes
        no attention mask; docs/verify-cache.md section 2). Both are exact identities of a causal model, so whatever
        they differ by is summation order: the floor below which no cache can be asked to agree."""
        key = tuple(tuple(p) for p in prompts)
        if key not in self._floors:
            trajs = [self.trajectory(p) for p in prompts]
            sources = {"prefix_vs_whole": max(_prefix_vs_whole(t) for t in trajs)}
            batched = self._batched_vs_solo(trajs, pad_id)
            if batched is not None:
                sources["batched_vs_solo"] = batched
            self._floors[key] = {"value": max(sources.values()), "sources": sources}
        return self._floors[key]

    @torch.no_grad()
    def _batched_vs_solo(self, trajs: list[ReferenceTrajectory], pad_id: int) -> float | None:
        seqs = padded_prompts([t.prompt + t.tokens[:-1] for t in trajs])  # equal lengths: a shorter row added
        if len(seqs) < 2:
            return None
        ids, mask = _left_pad(seqs, pad_id)
        try:
            out = self.reference.full(ids, attention_mask=mask)
            _check_logits(out, (len(seqs), ids.shape[1], None), "reference.full")
        except (TypeError, NotImplementedError, ValueError, RuntimeError):  # a reference without padding support
            return None
        L = ids.shape[1]
        return max(max_abs_diff(out[b, L - len(q) :].float(), self.logits(q)) for b, q in enumerate(seqs))

    def trajectory(self, prompt: Sequence[int]) -> ReferenceTrajectory:
        """Greedy reference run on ``prompt`` (cached)."""
        key = tuple(int(t) for t in prompt)
        if key in self._runs:
            return self._runs[key]
        need = len(key) + self.steps
        if self.max_positions is not None and need > self.max_positions:
            raise ValueError(
                f"prompt of {len(key)} tokens + {self.steps} steps needs {need} positions but the model's "
                f"context length is {self.max_positions}: shorten the prompt or lower the number of new tokens"
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
        seq_logits = self.logits(seq) if self.steps else prefill
        traj = ReferenceTrajectory(list(key), prefill, step_logits, tokens, seq_logits, self.steps, prefill.shape[-1])
        self._runs[key] = traj
        return traj


def _prefix_vs_whole(tr: ReferenceTrajectory) -> float:
    """Step logits (a forward over the sequence so far) vs the same positions of the whole sequence's forward."""
    P = len(tr.prompt)
    d = max_abs_diff(tr.prefill_logits, tr.seq_logits[:P])
    for k in range(1, len(tr.step_logits) - 1):  # the last step's forward *is* the whole sequence's
        d = max(d, max_abs_diff(tr.step_logits[k], tr.seq_logits[P - 1 + k]))
    return d


def _left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ids and the protocol's attention mask (a LongTensor, 1 for real tokens) of ``seqs`` left-padded."""
    ids, valid = left_padded(seqs, max(len(q) for q in seqs), 0, pad_id, torch.device("cpu"))
    return ids, valid.long()


# ---- calling the implementation: its exceptions are findings, not harness failures ---------------------
class ImplCrash(Exception):
    """The implementation under test raised (or returned logits of the wrong shape) at ``call``."""

    def __init__(self, call: int | None, exc: BaseException):
        super().__init__(str(exc))
        self.call, self.exc = call, exc


def _check_logits(x: Any, shape: tuple[int, int, int | None], where: str) -> None:
    """Raise ValueError unless ``x`` is a (B, T, V) tensor (V unchecked when None)."""
    want = tuple(shape) if shape[2] is not None else tuple(shape[:2])
    if not isinstance(x, torch.Tensor) or x.dim() != 3 or tuple(x.shape[: len(want)]) != want:
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        v = "vocab" if shape[2] is None else shape[2]
        raise ValueError(f"{where} returned {got}; expected logits of shape ({shape[0]}, {shape[1]}, {v})")


def _call(
    call: int,
    fn: Callable[..., torch.Tensor],
    ids: torch.Tensor,
    shape: tuple[int, int, int],
    where: str,
    **kw: torch.Tensor | None,
) -> torch.Tensor:
    """``fn(ids, **kw)`` with its logits' shape checked; any exception becomes :class:`ImplCrash`."""
    try:
        out = fn(ids, **kw)
        _check_logits(out, shape, where)
        return out
    except Exception as exc:  # noqa: BLE001 — whatever the implementation raises is what we report
        raise ImplCrash(call, exc) from exc


def _reset(impl: Any) -> None:
    try:
        impl.reset()
    except Exception as exc:  # noqa: BLE001 — as in _call
        raise ImplCrash(None, exc) from exc


def _t(ids: Sequence[int]) -> torch.Tensor:
    return torch.tensor([list(ids)], dtype=torch.long)


# ---- feeding the implementation -----------------------------------------------------------------------
def decode_calls(
    impl: Any, prompt: list[int], V: int, n: int, feed: Sequence[int] | None = None, where: str = "", reset: bool = True
) -> Iterator[tuple[int, torch.Tensor]]:
    """``reset()``, prefill ``prompt``, then ``n`` single-token steps, each fed ``feed[k-1]`` (without ``feed``: the
    previous call's argmax); yields each call's index and logits ((P, V) for the prefill, (1, V) for a step)."""
    if reset:
        _reset(impl)
    out = _call(0, impl.prefill, _t(prompt), (1, len(prompt), V), f"{where}prefill")[0]
    yield 0, out
    for k in range(1, n + 1):
        token = feed[k - 1] if feed is not None else int(out[-1].argmax())
        out = _call(k, impl.step, _t([token]), (1, 1, V), f"{where}step")[0]
        yield k, out


def chunk_calls(impl: Any, seq: list[int], chunk: int, V: int) -> Iterator[tuple[int, int, torch.Tensor]]:
    """``reset()``, then ``seq`` fed ``chunk`` tokens a call (the first by prefill); yields (call, start, logits)."""
    _reset(impl)
    for call, start in enumerate(range(0, len(seq), chunk)):
        piece = seq[start : start + chunk]
        fn = impl.prefill if call == 0 else impl.step
        yield call, start, _call(call, fn, _t(piece), (1, len(piece), V), f"chunk_{chunk} call {call}")[0]


# ---- phases ------------------------------------------------------------------------------------------
@torch.no_grad()
def _teacher_forced(impl: Any, tr: ReferenceTrajectory, pre: PhaseTracker | None, inc: PhaseTracker) -> list[int]:
    """Prefill ``tr.prompt`` then step through the reference's greedy tokens; returns the implementation's argmaxes."""
    own = []
    for k, out in decode_calls(impl, tr.prompt, tr.vocab, tr.steps, tr.tokens):
        if k == 0:
            (pre or inc).add(0, out, tr.prefill_logits)
        else:
            inc.add(k, out[-1], tr.step_logits[k])
        own.append(int(out[-1].argmax()))
    return own


@torch.no_grad()
def _chunk_phase(impl: Any, trajs: list[ReferenceTrajectory], chunk: int, tr_: PhaseTracker) -> None:
    """The reference's whole greedy sequence fed in chunks of ``chunk`` tokens."""
    for tr in trajs:
        for call, start, out in chunk_calls(impl, tr.prompt + tr.tokens[:-1], chunk, tr.vocab):
            tr_.add(call, out, tr.seq_logits[start : start + len(out)])


def padded_prompts(prompts: list[list[int]]) -> list[list[int]]:
    """Prompts for the padded batch: the given ones, plus a shorter prefix of the first when all lengths are equal.

    A prefix, not a suffix: the rows then end in different tokens, so the last cached entries that a row
    mix-up exchanges (right-aligned under left padding, they share a slot) hold different keys; a suffix
    ends in the same token and would hide the mix-up almost entirely."""
    p = prompts[0]
    if len({len(q) for q in prompts}) > 1 or len(p) < 2:  # lengths differ already, or nothing shorter to pad
        return prompts
    return prompts + [p[: (len(p) + 1) // 2]]


@torch.no_grad()
def _padded_phase(impl: Any, run: ReferenceRun, prompts: list[list[int]], tr_: PhaseTracker, pad_id: int) -> None:
    """Left-padded batch (prefill + teacher-forced decode) vs each prompt alone."""
    trajs = [run.trajectory(p) for p in prompts]
    B, L = len(prompts), max(len(p) for p in prompts)
    ids, mask = _left_pad(prompts, pad_id)
    _reset(impl)
    V = trajs[0].vocab
    out = _call(0, impl.prefill, ids, (B, L, V), "padded prefill", attention_mask=mask).detach().float()
    got = [out[b, L - len(p) :].clone() for b, p in enumerate(prompts)]  # per row: its logits, call by call
    tr_.add(0, torch.cat(got), torch.cat([t.prefill_logits for t in trajs]))
    for k in range(1, run.steps + 1):
        step_ids = torch.tensor([[t.tokens[k - 1]] for t in trajs], dtype=torch.long)
        out = _call(k, impl.step, step_ids, (B, 1, V), "padded step")
        tr_.add(k, out[:, -1], torch.stack([t.step_logits[k] for t in trajs]))
        got = [torch.cat([g, out[b, -1:].detach().float()]) for b, g in enumerate(got)]
    tr_.r.per_row = []  # each row vs the same prompt run alone: max |Δ| and the share of positions whose top-1 differs
    for p, g, t in zip(prompts, got, trajs, strict=True):
        ref = torch.cat([t.prefill_logits, *(s[None] for s in t.step_logits[1:])])
        d, n = max_abs_diff(g, ref), int(g.shape[0])
        top1 = int((g.argmax(-1) != ref.argmax(-1)).sum()) / n
        tr_.r.per_row.append({"prompt_length": len(p), "max_abs_dlogit": d, "top1_disagreement": top1, "positions": n})


def isolation_partner(b: list[int], others: Sequence[Sequence[int]], vocab_size: int, max_len: int | None) -> list[int]:
    """Sequence A to run before B: another prompt that differs in length and tokens, else one derived from B.

    The derived A shifts every token of B by one (mod the vocabulary, so no position holds B's token)
    and is one token longer (shorter when the context has no room): its keys can coincide with none of B's.
    """
    for a in others:
        if len(a) != len(b) and list(a[: len(b)]) != list(b[: len(a)]):
            return [int(t) for t in a]
    shifted = [(int(t) + 1) % vocab_size for t in b]
    if max_len is None or len(b) + 1 <= max_len:
        return shifted + [(int(b[-1]) + 2) % vocab_size]
    return shifted[:-1] if len(b) > 1 else shifted


@torch.no_grad()
def _isolation_phase(impl: Any, run: ReferenceRun, tr: ReferenceTrajectory, a: list[int], tr_: PhaseTracker) -> None:
    """Sequence A run to the end on the implementation's own tokens, ``reset()``, then B teacher-forced vs B alone."""
    for _ in decode_calls(impl, a, tr.vocab, run.steps, where="isolation, sequence A: "):
        pass
    _teacher_forced(impl, tr, None, tr_)


NO_BACK_TO_BACK = (
    "the implementation does not declare prefill_starts_sequence = True (its prefill() may need reset() first)"
)


@torch.no_grad()
def _reuse_phase(impl: Any, run: ReferenceRun, cases: list[ReuseCase], tr_: PhaseTracker, reset: bool) -> None:
    """Each case prefilled (all but its last DECODE tokens) then stepped token by token, vs one forward of it.

    The call index of this phase is the case's; ``tr_.r.cases`` records each case's max |Δ| (and, for
    the repeat, whether it reproduced the first run of A bit for bit).
    """
    tr_.r.cases = []
    first: torch.Tensor | None = None
    for i, case in enumerate(cases):
        seq, where = list(case.seq), f"{tr_.r.phase} ({case.name}): "
        ref, n = run.logits(seq), len(seq) - DECODE
        calls = decode_calls(impl, seq[:n], ref.shape[-1], DECODE, seq[n:], where, reset=reset or i == 0)
        try:
            got = torch.cat([out for _, out in calls]).detach().float().clone()
        except ImplCrash as crash:
            raise ImplCrash(i, crash.exc) from crash.exc
        tr_.add(i, got, ref)
        rec: dict[str, Any] = {"case": case.name, "kind": case.kind, "shared_prefix": case.shared, "length": len(seq)}
        rec["max_abs_dlogit"] = max_abs_diff(got, ref)
        if case.kind == "base":
            first = got
        elif case.kind == "repeat" and first is not None:
            rec["bit_identical_to_first_run"] = bool(torch.equal(got, first))
            rec["max_abs_dlogit_vs_first_run"] = max_abs_diff(got, first)
        tr_.r.cases.append(rec)


def _phase(
    name: str, line: float, body: Callable[[PhaseTracker], None], skip_not_implemented: str | None = None
) -> PhaseTracker:
    """Run one phase; an implementation crash is recorded (or, for optional features, turns into a skip)."""
    tracker = PhaseTracker(name, line)
    try:
        body(tracker)
    except ImplCrash as crash:
        if skip_not_implemented and isinstance(crash.exc, NotImplementedError) and crash.call == 0:
            tracker.skip(f"{skip_not_implemented} ({crash.exc or 'NotImplementedError'})")
        else:
            tracker.fail(crash.exc, crash.call)
    return tracker


# ---- the whole verification --------------------------------------------------------------------------
@dataclass(frozen=True)
class VerifyOptions:
    """What a verification runs and how it judges: made once where it is asked for, passed down whole.

    ``max_new_tokens`` greedy steps per prompt; ``chunk_sizes`` of the chunked phases; ``padded_batch``,
    ``isolation`` and ``prefix_reuse`` (:mod:`genprobe.verify.reuse`) turn those phases on; ``noise_floor`` judges
    against the reference's own float noise (passing below ``thresholds.floor_multiple`` × it); ``pad_id`` fills
    the padded batch. ``compiled``, ``window``/``sinks`` and ``hf_position_ids`` choose what is verified
    (:func:`genprobe.verify.api.verify_targets`).
    """

    max_new_tokens: int = 50
    chunk_sizes: Sequence[int] = (1, 4)
    padded_batch: bool = True
    isolation: bool = True
    prefix_reuse: bool = True
    noise_floor: bool = True
    thresholds: Thresholds = Thresholds()
    pad_id: int = 0
    compiled: bool = False
    window: int | None = None
    sinks: int = 0
    hf_position_ids: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "chunk_sizes", tuple(int(c) for c in self.chunk_sizes))
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if any(c < 1 for c in self.chunk_sizes):
            raise ValueError(f"chunk sizes must all be >= 1, got {list(self.chunk_sizes)}")
        if self.window is None and self.sinks:
            raise ValueError("sinks only make sense with a window")
        if self.window is not None and self.compiled:
            raise ValueError("a window cannot be combined with the compiled decode path (its cache has no window)")


DEFAULTS = VerifyOptions()


def verify_implementation(
    impl: "CacheImpl",
    reference: "Reference | ReferenceRun",
    prompts: list[list[int]],
    opts: VerifyOptions = DEFAULTS,
    name: str | None = None,
) -> VerifyReport:
    """Compare ``impl`` with full recomputation (a reference or a shared :class:`ReferenceRun`), phase by phase."""
    steps, th = opts.max_new_tokens, opts.thresholds
    run = reference if isinstance(reference, ReferenceRun) else ReferenceRun(reference, steps)
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("prompts must be a non-empty list of non-empty token-id lists")
    check_impl(impl)
    if run.steps != steps:
        raise ValueError(f"the shared ReferenceRun was computed for {run.steps} steps, not {steps}")
    impl_max, need = getattr(impl, "max_positions", None), max(len(p) for p in prompts) + steps
    if impl_max is not None and need > impl_max:
        raise ValueError(
            f"{need} positions needed but the implementation's context length is {impl_max}: "
            "shorten the prompts or lower the number of new tokens"
        )
    prompts = [[int(t) for t in p] for p in prompts]
    trajs = [run.trajectory(p) for p in prompts]
    floor = run.noise_floor(prompts, opts.pad_id) if opts.noise_floor else None
    fv = None if floor is None else floor["value"]
    line = th.pass_line(fv)

    pre, inc = PhaseTracker("prefill", line), PhaseTracker("incremental", line)
    own: list[list[int] | None] = [None] * len(trajs)  # the implementation's argmaxes (None where it raised)
    try:
        for i, tr in enumerate(trajs):
            own[i] = _teacher_forced(impl, tr, pre, inc)
    except ImplCrash as crash:  # a crash in reset() or prefill belongs to the prefill phase
        target = pre if crash.call in (0, None) else inc
        target.fail(crash.exc, crash.call)
        if target is pre and inc.r.calls == 0:
            inc.skip("not reached: the prefill call raised")
    extra, reuse = _optional_phases(impl, run, trajs, opts, line)
    texts_tracker = PhaseTracker("greedy_text", line)
    texts = _texts(impl, trajs, own, texts_tracker)
    phases = [t.finish(th, fv) for t in (pre, inc, *extra)]
    if texts_tracker.r.error is not None:
        phases.append(texts_tracker.finish(th, fv))
    return VerifyReport(
        impl=name or getattr(impl, "name", None) or type(impl).__name__,
        verdict=overall_verdict(phases, th.exact_prefill),
        thresholds=th,
        steps=steps,
        prompt_lengths=[len(p) for p in prompts],
        phases=phases,
        reference=run.name,
        errors=[p.error for p in phases if p.error is not None],
        texts=texts,
        noise_floor=floor,
        pass_line=line,
        reuse=reuse,
    )


def _optional_phases(
    impl: Any, run: ReferenceRun, trajs: list[ReferenceTrajectory], opts: VerifyOptions, line: float
) -> tuple[list[PhaseTracker], list[str]]:
    """The phases ``opts`` turns on (chunked, padded batch, isolation, prefix reuse), and the reuse situations run."""
    trackers = [_phase(f"chunk_{c}", line, functools.partial(_chunk_phase, impl, trajs, c)) for c in opts.chunk_sizes]
    prompts = [tr.prompt for tr in trajs]
    if opts.padded_batch:
        padded, pad = padded_prompts(prompts), opts.pad_id
        no_padding = "implementation does not support padding"
        trackers.append(_phase("padded_batch", line, lambda t: _padded_phase(impl, run, padded, t, pad), no_padding))
    limits = [m for m in (run.max_positions, getattr(impl, "max_positions", None)) if m is not None]
    if opts.isolation:  # a partner sequence A that, with the steps, fits the tighter context
        a = isolation_partner(prompts[0], prompts[1:], trajs[0].vocab, min(limits) - run.steps if limits else None)
        trackers.append(_phase("isolation", line, lambda t: _isolation_phase(impl, run, trajs[0], a, t)))
    reuse: list[str] = []
    if opts.prefix_reuse:  # with reset() between the cases, and back to back where the protocol allows
        length, tr = min([REUSE_LENGTH, *limits]), trajs[0]
        a = (tr.prompt + tr.tokens)[:length]  # sequence A: the prompt, its greedy continuation, then random ids
        cases = reuse_cases(a + random_ids(tr.vocab, [length - len(a)])[0], tr.vocab, length)
        if cases:
            b2b = bool(getattr(impl, "prefill_starts_sequence", False))
            body = functools.partial(_reuse_phase, impl, run, cases)
            no_reset = functools.partial(body, reset=False) if b2b else lambda t: t.skip(NO_BACK_TO_BACK)
            trackers.append(_phase("prefix_reuse", line, functools.partial(body, reset=True)))
            trackers.append(_phase("prefix_reuse_no_reset", line, no_reset))
            reuse = situations(cases, None if b2b else NO_BACK_TO_BACK)
    return trackers, reuse


def _texts(
    impl: Any, trajs: list[ReferenceTrajectory], own: list[list[int] | None], tracker: PhaseTracker
) -> list[dict[str, Any]]:
    """Per prompt: the reference's greedy ids and the implementation's own (free-running) greedy ids.

    When the implementation's argmax matched the reference's token at every teacher-forced step, its
    free run would be fed exactly the same tokens, so the teacher-forced argmaxes *are* its free run.
    """
    texts: list[dict[str, Any]] = []
    for tr, teacher in zip(trajs, own, strict=True):
        ids = teacher if teacher in (None, tr.tokens) else None  # None: the greedy run itself crashed
        if ids is None:
            try:
                with torch.no_grad():
                    ids = [int(out[-1].argmax()) for _, out in decode_calls(impl, tr.prompt, tr.vocab, tr.steps)]
            except ImplCrash as crash:
                tracker.fail(crash.exc, crash.call)
        texts.append({"prompt": tr.prompt, "reference": tr.tokens, "implementation": ids or []})
    return texts
