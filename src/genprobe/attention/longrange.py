"""Synthetic long-range tasks and position-encoding extrapolation (ALiBi-paper style), on tiny models.

* **passkey** — fillers with a ``KEY v`` pair planted ``distance`` positions before the final ``QUERY``; the
  answer is ``v``. Solvable by content alone, whatever the position encoding.
* **lag** — random tokens; the target at every ``t >= k`` is ``x[t-k]``. Only position can solve it (one model
  per ``k``).
* :func:`corpus_extrapolation` — the Tang model per encoding at ``L = 64``: validation loss over non-overlapping
  windows of several lengths (Press et al. 2022), and on positions ``>= L`` only.

A learned position table past ``L`` raises the model's ``ValueError``: the measurement is then ``None`` and the
refusal is listed in the result's ``errors``. docs/longrange.md has the findings.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from statistics import fmean
from typing import Any

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..model.config import POS_ENCODINGS, GPTConfig
from ..model.gpt import GPT
from ..model.train import TrainConfig, fit, position_losses

PAD = 0
N_FILLER = 8
N_VALUE = 16
N_CONTENT = 16


# ---- task generators ------------------------------------------------------------------------------
class PasskeyTask:
    """``fillers … KEY v fillers … QUERY`` → ``v``; ``v`` sits ``distance`` positions before QUERY."""

    name = "passkey"
    FILLER0 = 1
    KEY = FILLER0 + N_FILLER
    QUERY = KEY + 1
    VALUE0 = QUERY + 1
    vocab_size = VALUE0 + N_VALUE

    def batch(self, distances: torch.Tensor, length: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows (B, length) and answers (B,) for per-row ``distances`` (each in [1, length-2])."""
        distances = distances.long()
        if int(distances.min()) < 1 or int(distances.max()) > length - 2:
            raise ValueError(f"passkey distances must lie in [1, {length - 2}] for rows of {length} tokens")
        B = len(distances)
        x = torch.randint(self.FILLER0, self.FILLER0 + N_FILLER, (B, length), generator=gen)
        values = torch.randint(self.VALUE0, self.VALUE0 + N_VALUE, (B,), generator=gen)
        rows = torch.arange(B)
        vpos = length - 1 - distances
        x[rows, vpos - 1] = self.KEY
        x[rows, vpos] = values
        x[:, -1] = self.QUERY
        return x, values

    def sample(self, n: int, length: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``n`` rows (distances uniform in [1, length-2]); targets: the answer last, -100 elsewhere."""
        x, v = self.batch(torch.randint(1, length - 1, (n,), generator=gen), length, gen)
        y = torch.full_like(x, -100)
        y[:, -1] = v
        return x, y


class LagTask:
    """Random content tokens; the target at every position ``t >= k`` is ``x[t-k]`` — the token exactly
    ``k`` places back. One model per ``k`` (dense supervision, learns in a few hundred steps)."""

    name = "lag"
    CONTENT0 = 1
    vocab_size = CONTENT0 + N_CONTENT

    def __init__(self, lag: int):
        if lag < 1:
            raise ValueError(f"lag must be >= 1, got {lag}")
        self.lag = lag

    def sample(self, n: int, length: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows (n, length) and targets (n, length); positions ``t < k`` are -100 (ignored)."""
        if length <= self.lag:
            raise ValueError(f"rows of {length} tokens have no position {self.lag} places after another")
        x = torch.randint(self.CONTENT0, self.CONTENT0 + N_CONTENT, (n, length), generator=gen)
        y = torch.full_like(x, -100)
        y[:, self.lag :] = x[:, : length - self.lag]
        return x, y


# ---- training and evaluation ----------------------------------------------------------------------
@dataclass
class SyntheticConfig:
    """Tiny-GPT recipe for the synthetic tasks (seconds of CPU per model)."""

    context: int = 32
    # GPTConfig overrides (its 2 layers and 4 heads, a narrower residual stream)
    model: dict = field(default_factory=lambda: {"d_model": 64, "d_ff": 128})
    passkey_steps: int = 400
    lag_steps: int = 300
    lags: tuple[int, ...] = (1, 8, 24)
    batch_size: int = 64
    lr: float = 3e-3
    warmup: int = 30
    seed: int = 0
    eval_samples: int = 200

    def __post_init__(self) -> None:
        if self.context < 4:
            raise ValueError(f"context must be >= 4, got {self.context}")
        if min(self.passkey_steps, self.lag_steps, self.batch_size, self.eval_samples) < 1:
            raise ValueError("steps, batch_size and eval_samples must be >= 1")
        if not self.lags or min(self.lags) < 1 or max(self.lags) >= self.context:
            raise ValueError(f"lags must lie in [1, {self.context - 1}], got {self.lags}")


def _lr_factor(step: int, steps: int, warmup: int) -> float:
    """Linear warm-up, then cosine decay, floored at 5% of the peak."""
    cosine = 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))
    return max((step + 1) / warmup if step < warmup else cosine, 0.05)


@dataclass(frozen=True)
class TrainSummary:
    """How one synthetic model trained: steps, mean loss over the last 20 steps, wall seconds."""

    steps: int
    final_loss: float
    seconds: float


@dataclass(frozen=True)
class EvalError:
    """A measurement the model refused (learned positions past their table): where, and the model's error."""

    at: str
    message: str


def train_synthetic(task, pos_encoding: str, sc: SyntheticConfig) -> tuple[GPT, TrainSummary]:
    """Train a tiny GPT on ``task`` with rows of ``sc.context`` tokens (passkey: distance uniform in [1, L-2])."""
    torch.manual_seed(sc.seed)
    gen = torch.Generator().manual_seed(sc.seed)
    L = sc.context
    steps = sc.lag_steps if isinstance(task, LagTask) else sc.passkey_steps
    model = GPT(GPTConfig(**{**sc.model, "vocab_size": task.vocab_size, "block_size": L, "pos_encoding": pos_encoding}))

    def batch_loss() -> torch.Tensor:
        x, y = task.sample(sc.batch_size, L, gen)
        logits = model(x)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), ignore_index=-100)

    t0 = time.time()
    tc = TrainConfig(steps=steps, lr=sc.lr, warmup=sc.warmup, weight_decay=0.0)  # AdamW (0.9, 0.95), clipped at 1
    losses = fit(model, batch_loss, tc, lr_of=lambda step: sc.lr * _lr_factor(step, steps, sc.warmup)).losses
    model.eval()
    return model, TrainSummary(steps, round(fmean(losses[-20:]), 4), round(time.time() - t0, 1))


@torch.no_grad()
def passkey_accuracy(
    model: GPT, task: PasskeyTask, distance: int, length: int, samples: int, seed: int = 1234, batch: int = 256
) -> float:
    """Passkey accuracy at one (distance, row length); the model's ``ValueError`` when it refuses the length."""
    gen = torch.Generator().manual_seed(seed + 7919 * distance + length)
    correct = 0
    for start in range(0, samples, batch):
        n = min(batch, samples - start)
        x, v = task.batch(torch.full((n,), distance), length, gen)
        correct += int((model(x)[:, -1].argmax(-1) == v).sum())
    return correct / samples


@torch.no_grad()
def lag_accuracy(model: GPT, task: LagTask, length: int, context: int, samples: int, seed: int = 4321) -> float:
    """Lag-task accuracy on rows of ``length``: over positions ``k <= t < context`` when ``length <= context``,
    else over the positions beyond the training context only (``t >= context``); the model's ``ValueError``
    when it refuses the length."""
    gen = torch.Generator().manual_seed(seed + length)
    x, y = task.sample(samples, length, gen)
    pred = model(x).argmax(-1)
    sel = y != -100
    if length > context:
        sel[:, :context] = False
    return float((pred[sel] == y[sel]).float().mean())


def _measured(errors: list[EvalError], at: str, measure, *args):
    """``measure(*args)``, or None with the model's refusal (its ``ValueError``) recorded in ``errors``."""
    try:
        return measure(*args)
    except ValueError as exc:
        errors.append(EvalError(at, str(exc)))
        return None


def passkey_grid(context: int) -> list[int]:
    """Distances evaluated for passkey: a spread inside the context, then up to 4× beyond it."""
    inside = sorted({1, 2, 4, context // 4, context // 2, 3 * context // 4, context - 2})
    beyond = [context + context // 4, 2 * context - 2, 3 * context - 2, 4 * context - 2]
    return [d for d in inside if d >= 1] + beyond


@dataclass
class TaskResult:
    """One encoding on a synthetic task: how it trained and its accuracy (None: refused). Passkey: one model,
    accuracy per distance; lag: one model per lag, accuracy per evaluation length, then per lag."""

    train: TrainSummary | dict[int, TrainSummary]
    accuracy: dict[int, Any]
    errors: list[EvalError] = field(default_factory=list)


def lag_eval_lengths(context: int) -> list[int]:
    """Row lengths the lag task is evaluated at: the training context, 2× and 4×."""
    return [context, 2 * context, 4 * context]


@dataclass
class SyntheticResult:
    """Both synthetic tasks for every encoding, trained at ``config.context``."""

    config: SyntheticConfig
    passkey: dict[str, TaskResult]
    lag: dict[str, TaskResult]

    def to_dict(self) -> dict:
        """JSON form: the config, then per task its settings and per-encoding results."""
        L = self.config.context
        return {
            "config": self.config,
            "context": L,
            "tasks": {
                "passkey": {
                    "vocab_size": PasskeyTask.vocab_size,
                    "distances": passkey_grid(L),
                    "row_length": "max(context, distance + 2)",
                    "chance": 1 / N_VALUE,
                    "encodings": self.passkey,
                },
                "lag": {
                    "vocab_size": LagTask.vocab_size,
                    "lags": list(self.config.lags),
                    "eval_lengths": lag_eval_lengths(L),
                    "chance": 1 / N_CONTENT,
                    "measure": f"length {L}: positions k..{L - 1}; longer rows: positions >= {L} only",
                    "encodings": self.lag,
                },
            },
        }


def run_synthetic(pos_encodings: list[str], sc: SyntheticConfig, progress: bool = False) -> SyntheticResult:
    """Both tasks × each encoding, trained at ``sc.context``: passkey (one model, accuracy at every
    :func:`passkey_grid` distance, rows ``max(L, d+2)``), then lag (one model per lag in ``sc.lags``, accuracy at each
    :func:`lag_eval_lengths` length)."""
    L, res = sc.context, SyntheticResult(sc, {}, {})
    with tqdm(total=(1 + len(sc.lags)) * len(pos_encodings), desc="synthetic", disable=not progress) as bar:
        for pe in pos_encodings:
            model, summary = train_synthetic(passkey := PasskeyTask(), pe, sc)
            r = res.passkey[pe] = TaskResult(summary, {})
            for d in passkey_grid(L):
                n = max(L, d + 2)
                at = f"distance {d} (rows of {n})"
                r.accuracy[d] = _measured(r.errors, at, passkey_accuracy, model, passkey, d, n, sc.eval_samples)
            bar.update()
        for pe in pos_encodings:
            train: dict[int, TrainSummary] = {}
            r = res.lag[pe] = TaskResult(train, {n: {} for n in lag_eval_lengths(L)})
            for k in sc.lags:
                model, train[k] = train_synthetic(lag := LagTask(k), pe, sc)
                for n in r.accuracy:
                    r.accuracy[n][k] = _measured(
                        r.errors, f"lag {k}, rows of {n}", lag_accuracy, model, lag, n, L, max(8, sc.eval_samples // 4)
                    )
                bar.update()
    return res


# ---- the real corpus: validation loss vs evaluation length ----------------------------------------
@dataclass(frozen=True)
class WindowLoss:
    """Mean loss over non-overlapping windows: all positions, and positions >= the training context only."""

    loss: float
    loss_beyond_context: float | None
    windows: int


def window_losses(model: GPT, ids: torch.Tensor, length: int, context: int, batch_size: int = 32) -> WindowLoss:
    """Mean loss over non-overlapping windows of ``length`` (all positions, and positions >= ``context``)."""
    per_pos = position_losses(model, ids, length, batch_size)
    beyond = round(float(per_pos[context:].mean()), 4) if length > context else None
    return WindowLoss(round(float(per_pos.mean()), 4), beyond, (len(ids) - 1) // length)


@dataclass
class CorpusExtrapolationConfig:
    """Recipe for the Tang-corpus extrapolation runs (defaults: the chapter's reference model, full training)."""

    context: int = 64
    eval_lengths: tuple[int, ...] = (32, 64, 128, 256)
    steps: int = 2000
    batch_size: int = 32
    warmup: int = 100
    seed: int = 0
    max_val_tokens: int | None = None
    poems: int = 4003
    model: dict = field(default_factory=dict)  # GPTConfig overrides (tests use a tiny model)

    def __post_init__(self) -> None:
        if any(n < 2 for n in self.eval_lengths):
            raise ValueError(f"eval lengths must be >= 2, got {self.eval_lengths}")


@dataclass
class CorpusEncodingResult:
    """One encoding on the corpus: training time and final validation loss, then loss per evaluation length."""

    train_seconds: float
    train_val_loss: float | None
    by_length: dict[int, WindowLoss | None]
    errors: list[EvalError] = field(default_factory=list)


@dataclass
class CorpusResult:
    """Validation loss vs evaluation length for every encoding, trained on the Tang corpus at ``config.context``."""

    JSON_PROPERTIES = ("averaging",)  # how the losses are averaged, kept in the JSON form
    averaging = (
        "non-overlapping windows; 'loss' = mean over all positions (ALiBi paper), "
        "'loss_beyond_context' = mean over positions >= context only"
    )

    config: CorpusExtrapolationConfig
    val_tokens: int
    encodings: dict[str, CorpusEncodingResult]


def corpus_extrapolation(
    pos_encodings: list[str], cc: CorpusExtrapolationConfig, progress: bool = False
) -> CorpusResult:
    """Train the Tang GPT at ``cc.context`` per encoding; validation loss at each evaluation length."""
    from ..corpus.tang import load_corpus
    from ..corpus.tokenizer import CharTokenizer
    from ..model.train import train

    corpus = load_corpus(poems=cc.poems)
    tok = CharTokenizer.from_text(corpus.text, 1200)
    val = torch.tensor(tok.encode(corpus.val, warn=False), dtype=torch.long)
    if cc.max_val_tokens:
        val = val[: cc.max_val_tokens + 1]
    out = CorpusResult(cc, len(val) - 1, {})
    for pe in pos_encodings:
        cfg = GPTConfig(**{**cc.model, "vocab_size": tok.vocab_size, "block_size": cc.context, "pos_encoding": pe})
        tc = TrainConfig(steps=cc.steps, batch_size=cc.batch_size, warmup=cc.warmup, seed=cc.seed, eval_every=0)
        t0 = time.time()
        r = train(corpus, tok, cfg=cfg, tc=tc, progress=progress)
        res = CorpusEncodingResult(round(time.time() - t0, 1), r.summary["val_loss"], {})
        for n in cc.eval_lengths:
            res.by_length[n] = _measured(res.errors, f"windows of {n}", window_losses, r.model, val, n, cc.context)
        out.encodings[pe] = res
    return out


# ---- everything together --------------------------------------------------------------------------
@dataclass
class LongRangeConfig:
    """What ``genprobe longrange`` runs."""

    pos_encodings: list[str] = field(default_factory=lambda: ["learned", "rope", "alibi"])
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    corpus: CorpusExtrapolationConfig | None = field(default_factory=CorpusExtrapolationConfig)


def quick_config(pos_encodings: list[str] | None = None) -> LongRangeConfig:
    """The ``--quick`` recipe (a few minutes on 2 CPU cores)."""
    return LongRangeConfig(
        pos_encodings=pos_encodings or ["learned", "rope", "alibi"],
        synthetic=SyntheticConfig(passkey_steps=300, lag_steps=250, eval_samples=200),
        corpus=CorpusExtrapolationConfig(steps=250, warmup=50, max_val_tokens=16384),
    )


@dataclass
class EncodingSummary:
    """Headline numbers of one encoding (None where a measurement was refused or not run)."""

    passkey_min_inside: float | None
    passkey_mean_beyond: float | None
    lag_mean: dict[int, float | None]  # evaluation length -> mean accuracy over lags
    val_loss: dict[int, float | None] = field(default_factory=dict)  # evaluation length -> corpus loss
    val_loss_increase_at_longest: float | None = None

    def to_dict(self) -> dict:
        """JSON form with flat keys (``lag_mean_len32``, ``val_loss_len128`` …)."""
        d = {"passkey_min_inside": self.passkey_min_inside, "passkey_mean_beyond": self.passkey_mean_beyond}
        d |= {f"lag_mean_len{n}": v for n, v in self.lag_mean.items()}
        d |= {f"val_loss_len{n}": v for n, v in self.val_loss.items()}
        growth = self.val_loss_increase_at_longest
        return d if growth is None else d | {"val_loss_increase_at_longest": growth}


def _whole(reduce, values: list[float | None]) -> float | None:
    """``reduce(values)``; None when any is missing (a partial mean would hide the refusal)."""
    return None if not values or None in values else reduce(values)


@dataclass
class LongRangeResult:
    """What ``genprobe longrange`` measures: synthetic tasks, corpus extrapolation (None: not run), and a summary
    per encoding (its JSON form is ``longrange.json``)."""

    JSON_PROPERTIES = ("summary",)  # computed from the fields, kept in the JSON form

    pos_encodings: list[str]
    synthetic: SyntheticResult
    corpus: CorpusResult | None
    seconds: float

    @property
    def summary(self) -> dict[str, EncodingSummary]:
        """Headline numbers per encoding: in-/beyond-context passkey accuracy, mean lag accuracy per length, corpus
        loss and its growth past L."""
        syn, corpus, out = self.synthetic, self.corpus, {}
        for pe in self.pos_encodings:
            L, pk = syn.config.context, syn.passkey[pe].accuracy
            s = out[pe] = EncodingSummary(
                passkey_min_inside=_whole(min, [a for d, a in pk.items() if d <= L - 2]),
                passkey_mean_beyond=_whole(fmean, [a for d, a in pk.items() if d > L - 2]),
                lag_mean={n: _whole(fmean, list(accs.values())) for n, accs in syn.lag[pe].accuracy.items()},
            )
            if corpus is not None:
                by = corpus.encodings[pe].by_length
                s.val_loss = {n: None if w is None else w.loss for n, w in by.items()}
                base, last = by.get(corpus.config.context), by[max(by)]
                if base is not None and last is not None and max(by) > corpus.config.context:
                    s.val_loss_increase_at_longest = round(last.loss - base.loss, 4)
        return out

    @property
    def errors(self) -> dict[str, list[EvalError]]:
        """Every refused measurement, per encoding (synthetic tasks first, then the corpus)."""
        syn, corpus = self.synthetic, self.corpus.encodings if self.corpus is not None else {}
        return {
            pe: syn.passkey[pe].errors + syn.lag[pe].errors + (corpus[pe].errors if corpus else [])
            for pe in self.pos_encodings
        }


def run_longrange(lc: LongRangeConfig, progress: bool = False) -> LongRangeResult:
    """Synthetic tasks + corpus extrapolation for every encoding."""
    bad = [p for p in lc.pos_encodings if p not in POS_ENCODINGS]
    if bad or not lc.pos_encodings:
        raise ValueError(f"position encodings must be among {', '.join(POS_ENCODINGS)}; got {lc.pos_encodings}")
    t0 = time.time()
    syn = run_synthetic(lc.pos_encodings, lc.synthetic, progress)
    corpus = corpus_extrapolation(lc.pos_encodings, lc.corpus, progress) if lc.corpus is not None else None
    return LongRangeResult(list(lc.pos_encodings), syn, corpus, round(time.time() - t0, 1))
