"""Synthetic long-range tasks and position-encoding extrapolation (seed 002 §2.2, §4.3; ALiBi paper style).

Two synthetic tasks with a tiny GPT trained on rows of the training context ``L``:

* **passkey** — filler tokens everywhere, except a ``KEY v`` pair planted so that the value ``v`` sits
  exactly ``distance`` positions before the final ``QUERY`` token; the answer (at the last position)
  is ``v``. Value tokens never appear elsewhere, so this is solvable *by content alone* (attend to
  the one value token), whatever the position encoding. Trained with distances uniform in [1, L-2];
  evaluated at distances inside ``L`` and beyond it (rows of ``distance + 2`` tokens).
* **lag** ("which token stood exactly k places back") — random content tokens; at every position
  ``t >= k`` the target is ``x[t-k]``. Content cannot help (tokens are random): only position can.
  One model per ``k`` (dense targets learn in a few hundred steps). ALiBi, whose only positional
  signal is a monotone distance penalty, is expected to fail for ``k > 1``; learned / RoPE learn it.
  Evaluated on rows of ``L`` and on longer rows (positions ``>= L`` only).

A learned position table past ``L`` raises the model's ``ValueError``, recorded as ``"error: ..."``.

:func:`corpus_extrapolation` trains the Tang model once per encoding at ``L = 64`` and measures the
validation loss at several evaluation lengths over *non-overlapping* windows (every target counted
once, averaged over all positions, as in Press et al. 2022), plus the loss on positions ``>= L`` only.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..model.config import GPTConfig
from ..model.gpt import GPT

PAD = 0
N_FILLER = 8
N_VALUE = 16
N_CONTENT = 16


# ---------------------------------------------------------------------------------------------
# task generators
# ---------------------------------------------------------------------------------------------
class PasskeyTask:
    """``fillers … KEY v fillers … QUERY`` → ``v``; ``v`` sits ``distance`` positions before QUERY."""

    name = "passkey"
    FILLER0 = 1
    KEY = FILLER0 + N_FILLER
    QUERY = KEY + 1
    VALUE0 = QUERY + 1
    vocab_size = VALUE0 + N_VALUE

    def min_length(self, distance: int) -> int:
        """Shortest row that fits ``distance`` (KEY, value, …, QUERY)."""
        return distance + 2

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

    def batch(self, n: int, length: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows (n, length) and targets (n, length); positions ``t < k`` are -100 (ignored)."""
        if length <= self.lag:
            raise ValueError(f"rows of {length} tokens have no position {self.lag} places after another")
        x = torch.randint(self.CONTENT0, self.CONTENT0 + N_CONTENT, (n, length), generator=gen)
        y = torch.full_like(x, -100)
        y[:, self.lag :] = x[:, : length - self.lag]
        return x, y


# ---------------------------------------------------------------------------------------------
# training and evaluation
# ---------------------------------------------------------------------------------------------
@dataclass
class SyntheticConfig:
    """Tiny-GPT recipe for the synthetic tasks (seconds of CPU per model)."""

    context: int = 32
    n_layer: int = 2
    n_head: int = 4
    d_model: int = 64
    d_ff: int = 128
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


def _passkey_sampler(task: PasskeyTask, L: int, n: int):
    def sample(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        x, v = task.batch(torch.randint(1, L - 1, (n,), generator=gen), L, gen)
        y = torch.full_like(x, -100)
        y[:, -1] = v
        return x, y

    return sample


def train_synthetic(task, pos_encoding: str, sc: SyntheticConfig, steps: int | None = None,
                    progress: bool = False) -> tuple[GPT, dict]:
    """Train a tiny GPT on ``task`` with rows of ``sc.context`` tokens (passkey: distance uniform in [1, L-2])."""
    torch.manual_seed(sc.seed)
    gen = torch.Generator().manual_seed(sc.seed)
    L = sc.context
    steps = steps or (sc.lag_steps if isinstance(task, LagTask) else sc.passkey_steps)
    cfg = GPTConfig(vocab_size=task.vocab_size, n_layer=sc.n_layer, n_head=sc.n_head, d_model=sc.d_model,
                    d_ff=sc.d_ff, block_size=L, pos_encoding=pos_encoding)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=sc.lr, betas=(0.9, 0.95), weight_decay=0.0)
    if isinstance(task, LagTask):
        sample = lambda g: task.batch(sc.batch_size, L, g)  # noqa: E731
    else:
        sample = _passkey_sampler(task, L, sc.batch_size)
    t0 = time.time()
    losses = []
    model.train()
    for step in tqdm(range(steps), desc=f"{task.name}/{pos_encoding}", disable=not progress, leave=False):
        if step < sc.warmup:
            frac = (step + 1) / sc.warmup
        else:
            frac = 0.5 * (1 + math.cos(math.pi * (step - sc.warmup) / max(1, steps - sc.warmup)))
        for g in opt.param_groups:
            g["lr"] = sc.lr * max(frac, 0.05)
        x, y = sample(gen)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
    model.eval()
    tail = losses[-20:]
    return model, {"steps": steps, "final_loss": round(sum(tail) / len(tail), 4), "seconds": round(time.time() - t0, 1)}


@torch.no_grad()
def passkey_accuracy(model: GPT, task: PasskeyTask, distance: int, length: int, samples: int,
                     seed: int = 1234, batch: int = 256) -> float | str:
    """Passkey accuracy at one (distance, row length); ``"error: ..."`` when the model refuses the length."""
    gen = torch.Generator().manual_seed(seed + 7919 * distance + length)
    correct = 0
    try:
        for start in range(0, samples, batch):
            n = min(batch, samples - start)
            x, v = task.batch(torch.full((n,), distance), length, gen)
            correct += int((model(x)[:, -1].argmax(-1) == v).sum())
    except ValueError as exc:
        return f"error: {exc}"
    return correct / samples


@torch.no_grad()
def lag_accuracy(model: GPT, task: LagTask, length: int, context: int, samples: int, seed: int = 4321) -> float | str:
    """Lag-task accuracy on rows of ``length``: over positions ``k <= t < context`` when ``length <= context``,
    else over the positions beyond the training context only (``t >= context``)."""
    gen = torch.Generator().manual_seed(seed + length)
    try:
        x, y = task.batch(samples, length, gen)
        pred = model(x).argmax(-1)
    except ValueError as exc:
        return f"error: {exc}"
    sel = y != -100
    if length > context:
        sel[:, :context] = False
    return float((pred[sel] == y[sel]).float().mean())


def passkey_grid(context: int) -> list[int]:
    """Distances evaluated for passkey: a spread inside the context, then up to 4× beyond it."""
    inside = sorted({1, 2, 4, context // 4, context // 2, 3 * context // 4, context - 2})
    beyond = [context + context // 4, 2 * context - 2, 3 * context - 2, 4 * context - 2]
    return [d for d in inside if d >= 1] + beyond


def run_synthetic(pos_encodings: list[str], sc: SyntheticConfig, progress: bool = False) -> dict:
    """Both tasks × each encoding: training summaries and accuracy inside/beyond the training context."""
    L = sc.context
    out = {"config": {**asdict(sc), "lags": list(sc.lags)}, "context": L, "tasks": {}}
    bar = tqdm(total=(1 + len(sc.lags)) * len(pos_encodings), desc="synthetic", disable=not progress)
    task = PasskeyTask()
    pk: dict = {"vocab_size": task.vocab_size, "distances": passkey_grid(L), "row_length": "max(context, distance + 2)",
                "chance": 1 / N_VALUE, "encodings": {}}
    for pe in pos_encodings:
        model, summary = train_synthetic(task, pe, sc)
        acc = {str(d): passkey_accuracy(model, task, d, max(L, d + 2), sc.eval_samples) for d in pk["distances"]}
        pk["encodings"][pe] = {"train": summary, "accuracy": acc}
        bar.update(1)
    lag: dict = {"vocab_size": LagTask.vocab_size, "lags": list(sc.lags), "eval_lengths": [L, 2 * L, 4 * L],
                 "chance": 1 / N_CONTENT,
                 "measure": f"length {L}: positions k..{L - 1}; longer rows: positions >= {L} only", "encodings": {}}
    for pe in pos_encodings:
        acc: dict = {str(n): {} for n in lag["eval_lengths"]}
        trains = {}
        for k in sc.lags:
            lt = LagTask(k)
            model, summary = train_synthetic(lt, pe, sc)
            trains[str(k)] = summary
            for n in lag["eval_lengths"]:
                acc[str(n)][str(k)] = lag_accuracy(model, lt, n, L, max(8, sc.eval_samples // 4))
            bar.update(1)
        lag["encodings"][pe] = {"train": trains, "accuracy": acc}
    bar.close()
    out["tasks"] = {"passkey": pk, "lag": lag}
    return out


# ---------------------------------------------------------------------------------------------
# the real corpus: validation loss vs evaluation length
# ---------------------------------------------------------------------------------------------
@torch.no_grad()
def window_losses(model: GPT, ids: torch.Tensor, length: int, context: int, batch_size: int = 32) -> dict:
    """Mean loss over non-overlapping windows of ``length`` (all positions, and positions >= ``context``)."""
    n = (len(ids) - 1) // length
    if n < 1:
        raise ValueError(f"need more than {length} validation tokens, got {len(ids)}")
    x = ids[: n * length].view(n, length)
    y = ids[1 : n * length + 1].view(n, length)
    tot = torch.zeros(length, dtype=torch.float64)
    for i in range(0, n, batch_size):
        logits = model(x[i : i + batch_size])
        ce = F.cross_entropy(logits.transpose(1, 2), y[i : i + batch_size], reduction="none")
        tot += ce.double().sum(0)
    per_pos = tot / n
    return {
        "loss": round(float(per_pos.mean()), 4),
        "loss_beyond_context": round(float(per_pos[context:].mean()), 4) if length > context else None,
        "windows": n,
    }


@dataclass
class CorpusExtrapolationConfig:
    """Recipe for the Tang-corpus extrapolation runs (defaults: the seed model, full training)."""

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


def corpus_extrapolation(pos_encodings: list[str], cc: CorpusExtrapolationConfig, progress: bool = False) -> dict:
    """Train the Tang GPT at ``cc.context`` per encoding; validation loss at each evaluation length."""
    from ..corpus import CharTokenizer, load_corpus
    from ..model.train import TrainConfig, train

    corpus = load_corpus(poems=cc.poems)
    tok = CharTokenizer.from_text(corpus.text, 1200)
    val = torch.tensor(tok.encode(corpus.val, warn=False), dtype=torch.long)
    if cc.max_val_tokens:
        val = val[: cc.max_val_tokens + 1]
    out = {"config": {**asdict(cc), "eval_lengths": list(cc.eval_lengths)}, "val_tokens": len(val) - 1,
           "averaging": "non-overlapping windows; 'loss' = mean over all positions (ALiBi paper), "
                        "'loss_beyond_context' = mean over positions >= context only",
           "encodings": {}}
    for pe in pos_encodings:
        cfg = GPTConfig(**{**cc.model, "vocab_size": tok.vocab_size, "block_size": cc.context, "pos_encoding": pe})
        tc = TrainConfig(steps=cc.steps, batch_size=cc.batch_size, warmup=cc.warmup, seed=cc.seed, eval_every=0)
        t0 = time.time()
        r = train(corpus, tok, cfg=cfg, tc=tc, progress=progress)
        res: dict = {"train_seconds": round(time.time() - t0, 1), "train_val_loss": r.summary["val_loss"], "by_length": {}}
        for n in cc.eval_lengths:
            try:
                res["by_length"][str(n)] = window_losses(r.model, val, n, cc.context)
            except ValueError as exc:
                res["by_length"][str(n)] = f"error: {exc}"
        out["encodings"][pe] = res
    return out


# ---------------------------------------------------------------------------------------------
# everything together
# ---------------------------------------------------------------------------------------------
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


def run_longrange(lc: LongRangeConfig, progress: bool = False) -> dict:
    """Synthetic tasks + corpus extrapolation for every encoding; plain JSON-ready data."""
    bad = [p for p in lc.pos_encodings if p not in ("learned", "rope", "alibi", "none")]
    if bad or not lc.pos_encodings:
        raise ValueError(f"position encodings must be among learned, rope, alibi, none; got {lc.pos_encodings}")
    t0 = time.time()
    out = {"pos_encodings": list(lc.pos_encodings), "synthetic": run_synthetic(lc.pos_encodings, lc.synthetic, progress)}
    if lc.corpus is not None:
        out["corpus"] = corpus_extrapolation(lc.pos_encodings, lc.corpus, progress)
    out["seconds"] = round(time.time() - t0, 1)
    out["summary"] = summarize(out)
    return out


def _num(v) -> float | None:
    return v if isinstance(v, (int, float)) else None


def summarize(res: dict) -> dict:
    """Headline numbers per encoding: in-/beyond-context accuracy means and loss growth past L."""
    syn = res["synthetic"]
    L = syn["context"]
    s: dict = {}
    for pe in res["pos_encodings"]:
        row: dict = {}
        pk = syn["tasks"]["passkey"]["encodings"][pe]["accuracy"]
        inside = [_num(v) for d, v in pk.items() if int(d) <= L - 2]
        beyond = [_num(v) for d, v in pk.items() if int(d) > L - 2]
        row["passkey_min_inside"] = min(inside) if all(v is not None for v in inside) else None
        row["passkey_mean_beyond"] = (sum(beyond) / len(beyond)) if all(v is not None for v in beyond) else "error"
        lag = syn["tasks"]["lag"]["encodings"][pe]["accuracy"]
        for n, accs in lag.items():
            vals = [_num(v) for v in accs.values()]
            row[f"lag_mean_len{n}"] = (sum(vals) / len(vals)) if all(v is not None for v in vals) else "error"
        if "corpus" in res:
            by = res["corpus"]["encodings"][pe]["by_length"]
            ctx = str(res["corpus"]["config"]["context"])
            base = by.get(ctx)
            for n, v in by.items():
                row[f"val_loss_len{n}"] = v["loss"] if isinstance(v, dict) else "error"
            if isinstance(base, dict):
                longest = max(by, key=int)
                if isinstance(by[longest], dict) and int(longest) > int(ctx):
                    row["val_loss_increase_at_longest"] = round(by[longest]["loss"] - base["loss"], 4)
        s[pe] = row
    return s
