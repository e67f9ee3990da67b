"""Training vs inference: teacher forcing on real text, confidence on real vs own text, and the shadow of
one wrong token (exposure bias, as the chapter measures it; the protocols: docs/case-study.md)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..corpus.tang import Corpus
from ..corpus.tokenizer import UNK_ID, CharTokenizer
from ..engine.generate import generate
from ..engine.samplers.stages import SamplerConfig
from ..model.gpt import GPT
from ..model.load import Tokenizer
from ._common import Rounded, r

SNIPPET = "已驚飛。方從列子御"
PERTURB_POSITIONS = (4, 8, 16, 24)
SHADOW_WINDOW = 16
TAIL_FROM = 5

#: ids (B, T) -> logits (B, T, V): a genprobe GPT is one; ``genprobe.experiments.phenomena`` passes any loaded model.
LogitsFn = Callable[[torch.Tensor], torch.Tensor]


def find_snippet(corpus: Corpus, snippet: str = SNIPPET) -> tuple[str, int]:
    """(split name, offset) of ``snippet`` in the validation split (else anywhere in the text)."""
    for split in ("val", "text"):
        if (i := getattr(corpus, split).find(snippet)) >= 0:
            return split, i
    raise ValueError(f"snippet {snippet!r} not found in the corpus ({corpus.source})")


@torch.no_grad()
def _row_losses(model: GPT | LogitsFn, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row next-token loss (T-1,) and log-probs (T-1, V) of ``ids`` under teacher forcing."""
    x = torch.tensor([ids], dtype=torch.long)
    logp = torch.log_softmax(model(x)[0, :-1].double(), -1)
    y = x[0, 1:]
    return -logp.gather(1, y[:, None])[:, 0], logp


@dataclass(frozen=True)
class TeacherForcingRow(Rounded):
    """Row ``pos`` of the teacher-forcing table: the context so far, the true next token, its loss, the top 3."""

    DIGITS_OF = {"loss": 6}

    pos: int
    context: str
    truth: str
    loss: float
    top3: list[dict]  # {"token", "prob" (rounded)}


@dataclass(frozen=True)
class TeacherForcing(Rounded):
    """Per-position loss of a text read under teacher forcing and its mean over the scored rows (JSON: the summary)."""

    JSON_KEYS = "lead_in_chars mean_loss perplexity"
    DIGITS_OF = {"perplexity": 2}

    rows: list[TeacherForcingRow]
    mean_loss: float
    lead_in_chars: int

    @property
    def perplexity(self) -> float:
        """exp(mean loss)."""
        return math.exp(self.mean_loss)


def teacher_forcing_table(model: GPT, tok: CharTokenizer, text: str, lead_in: str = "") -> TeacherForcing:
    """Per-position loss and top-3 of ``text`` (optionally preceded by ``lead_in`` as unscored context)."""
    pre = tok.encode(lead_in, warn=False)
    ids = tok.encode(text, warn=False)
    full = (pre + ids)[-model.cfg.block_size :]
    start = len(full) - len(ids)
    loss, logp = _row_losses(model, full)
    rows = []
    for i in range(len(ids) - 1):
        j = start + i
        top = torch.topk(logp[j].exp(), 3)
        top3 = [
            {"token": tok.token_str(int(t)), "prob": r(float(p))} for p, t in zip(top.values, top.indices, strict=True)
        ]
        context = tok.decode(ids[: i + 1], show_unk=True)
        rows.append(TeacherForcingRow(i, context, tok.token_str(ids[i + 1]), float(loss[j]), top3))
    scored = loss[start : start + len(ids) - 1]
    return TeacherForcing(rows, float(scored.mean()), len(lead_in))


@dataclass(frozen=True)
class RealTextConfidence(Rounded):
    """How sure the model is of its own argmax on real text, and what the truth costs there."""

    positions: int
    mean_argmax_prob: float
    mean_nll: float
    mean_truth_nll: float


@torch.no_grad()
def confidence_real_text(model: GPT, ids: list[int], windows: int = 32) -> RealTextConfidence:
    """Mean probability / NLL of the model's own argmax on real text (plus the NLL of the truth)."""
    T = model.cfg.block_size
    n = min(windows, (len(ids) - 1) // T)
    if n < 1:
        raise ValueError(f"need more than {T} tokens of real text, got {len(ids)}")
    x = torch.tensor(ids[: n * T + 1], dtype=torch.long)
    logp = torch.log_softmax(model(x[:-1].view(n, T)).double(), -1)
    best = logp.max(-1).values
    truth = logp.gather(-1, x[1:].view(n, T, 1))[..., 0]
    return RealTextConfidence(n * T, float(best.exp().mean()), float(-best.mean()), float(-truth.mean()))


@dataclass(frozen=True)
class FreeGenerationConfidence(Rounded):
    """How sure the model is of the tokens it chose itself while generating with ``sampler``."""

    samples: int
    new_tokens: int
    mean_chosen_prob: float
    mean_nll: float
    sampler: str


def confidence_free_generation(
    model: GPT, prompts: list[list[int]], new_tokens: int, sampler: SamplerConfig, name: str
) -> FreeGenerationConfidence:
    """Mean probability / NLL the model gives its own choices while generating freely (``name``: the sampler)."""
    res = generate(model, prompts, new_tokens, sampler=sampler, return_logits=True)  # seed 0
    assert res.step_logits is not None  # return_logits=True
    chosen = torch.tensor(res.tokens, dtype=torch.long)  # (B, N)
    logits = torch.stack(res.step_logits, 1).double()  # (B, N, V)
    lp = torch.log_softmax(logits, -1).gather(-1, chosen[..., None])[..., 0]
    return FreeGenerationConfidence(len(prompts), new_tokens, float(lp.exp().mean()), float(-lp.mean()), name)


@dataclass(frozen=True)
class Shadow(Rounded):
    """Δloss after one true token (``k + 1``) is replaced by what the model wanted there."""

    JSON_KEYS = "k truth model_wanted argmax_was_truth next_dloss peak tail_mean peak_step half_life_steps curve"

    k: int
    truth: str
    model_wanted: str
    argmax_was_truth: bool  # the model's argmax was the truth, so its runner-up was written instead
    curve: list[float]  # Δloss at steps 1..window

    @property
    def next_dloss(self) -> float:
        """Δloss at the first step."""
        return self.curve[0]

    @property
    def peak(self) -> float:
        """Largest Δloss."""
        return max(self.curve)

    @property
    def tail_mean(self) -> float:
        """Mean Δloss from step :data:`TAIL_FROM` on."""
        return statistics.fmean(self.curve[TAIL_FROM - 1 :])

    @property
    def peak_step(self) -> int:
        """The step of the largest Δloss."""
        return self.curve.index(self.peak) + 1

    @property
    def half_life_steps(self) -> int | None:
        """First step whose Δloss is at most half the peak."""
        return next((s + 1 for s, d in enumerate(self.curve) if d <= self.peak / 2), None)


def wanted_instead(logp_row: torch.Tensor, truth: int, banned: Sequence[int] = (UNK_ID,)) -> tuple[int, bool]:
    """The model's argmax (never a ``banned`` id: ``<unk>``), or its runner-up when the argmax IS the truth."""
    logp = logp_row.clone()
    logp[list(banned)] = -math.inf
    wanted = int(logp.argmax())
    if wanted != truth:
        return wanted, False
    logp[wanted] = -math.inf
    return int(logp.argmax()), True


def perturbation(
    model: GPT | LogitsFn,
    tok: CharTokenizer | Tokenizer,
    ids: list[int],
    k: int,
    window: int = SHADOW_WINDOW,
    banned: Sequence[int] = (UNK_ID,),
) -> Shadow:
    """Replace token ``k+1`` by the model's argmax (never a ``banned`` id); Δloss on the next ``window`` rows."""
    if not 0 <= k or k + 2 + window > len(ids):
        raise ValueError(f"perturbation at k={k} with window {window} needs {k + 2 + window} tokens, got {len(ids)}")
    ids = ids[: k + 2 + window]
    clean, logp = _row_losses(model, ids)
    wanted, runner_up = wanted_instead(logp[k], ids[k + 1], banned)
    bad = list(ids)
    bad[k + 1] = wanted
    pert, _ = _row_losses(model, bad)
    delta = (pert - clean)[k + 1 : k + 1 + window].tolist()
    return Shadow(k, tok.token_str(ids[k + 1]), tok.token_str(wanted), runner_up, delta)


@dataclass(frozen=True)
class ExposureResult:
    """The ``exposure`` key: teacher forcing on a real snippet, confidence on real vs own text, one wrong token."""

    snippet: str
    snippet_found_in: str
    snippet_offset: int
    teacher_forcing: TeacherForcing
    teacher_forcing_with_lead_in: TeacherForcing
    confidence_real_text: RealTextConfidence
    confidence_free_generation: FreeGenerationConfidence
    confidence_free_generation_greedy: FreeGenerationConfidence
    perturbation_passage: str
    perturbation: list[Shadow]

    def to_dict(self) -> dict:
        """JSON form (the ``exposure`` key of ``ch3_case.json``)."""
        tf, lead = self.teacher_forcing, self.teacher_forcing_with_lead_in
        return {
            "teacher_forcing_snippet": self.snippet,
            "snippet_found_in": self.snippet_found_in,
            "snippet_offset": self.snippet_offset,
            "teacher_forcing_rows": tf.rows,
            "teacher_forcing_mean_loss": r(tf.mean_loss),
            "teacher_forcing_perplexity": r(tf.perplexity, 2),
            "teacher_forcing_with_lead_in": lead,
            "confidence_real_text": self.confidence_real_text,
            "confidence_free_generation": self.confidence_free_generation,
            "confidence_free_generation_greedy": self.confidence_free_generation_greedy,
            "perturbation_passage": self.perturbation_passage,
            "perturbation_window": SHADOW_WINDOW,
            "perturbation_tail_from": TAIL_FROM,
            "perturbation": self.perturbation,
        }


def run_exposure(model: GPT, tok: CharTokenizer, corpus: Corpus, quick: bool = False) -> ExposureResult:
    """Teacher forcing on the chapter's snippet, confidence on real vs generated text, one wrong token's shadows."""
    split, at = find_snippet(corpus)
    source = getattr(corpus, split)
    T = model.cfg.block_size
    tf = teacher_forcing_table(model, tok, SNIPPET)
    tf_lead = teacher_forcing_table(model, tok, SNIPPET, lead_in=source[max(0, at - (T - len(SNIPPET))) : at])
    passage = tok.encode(source[at : at + T], warn=False)
    val_ids = tok.encode(corpus.val, warn=False)
    real = confidence_real_text(model, val_ids, windows=8 if quick else 32)
    n = 4 if quick else 16
    stride = max(1, (len(val_ids) - 16) // n)
    prompts = [val_ids[i * stride : i * stride + 8] for i in range(n)]  # 8-token prompts spread over the text
    free = confidence_free_generation(model, prompts, T - 8, SamplerConfig(temperature=1.0), "temperature 1.0")
    greedy = confidence_free_generation(model, prompts, T - 8, SamplerConfig(greedy=True), "greedy")
    shadows = [perturbation(model, tok, passage, k) for k in PERTURB_POSITIONS if k + 2 + SHADOW_WINDOW <= len(passage)]
    return ExposureResult(
        SNIPPET, split, at, tf, tf_lead, real, free, greedy, tok.decode(passage, show_unk=True), shadows
    )
