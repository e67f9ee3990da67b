"""Output quality, for the faults that are not cache bugs and change the output silently into fluent text (a config
that disagrees with the weights, a corrupted weight, a wrong tokenizer): KL and top-1 agreement against
``--reference``, else bits per character against :data:`KNOWN_GOOD` (docs/doctor.md, "Quality on held-out text")."""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field

import torch

from .._io import NOT_JSON, json_safe
from ..corpus.inputs import token_windows
from ..model.load import Model
from .options import DoctorRun, Finding, StageSkipped

WINDOWS, WINDOW_TOKENS = 8, 128  # held-out texts read, tokens of each (fewer when the context is shorter)
KL_WARN, KL_BUG = 0.1, 1.0  # mean KL(reference ‖ model), nats per token
TOP1_WARN, TOP1_BUG = 0.9, 0.5  # top-1 agreement with the reference
BPC_FACTOR = 1.5  # × the worst known-good model (a family's smallest scores worst, so it calibrates the family)
UNK_MAX = 0.5
# bits per character of known-good models on the doctor's held-out windows of each corpus (measured with this
# module: `genprobe doctor MODEL --only quality`, docs/doctor.md; SmolLM2's perplexity is 33.2 per token)
KNOWN_GOOD: dict[str, dict[str, float]] = {"english": {"SmolLM2-135M-Instruct (Q4_1 GGUF)": 1.03}}


@dataclass
class Quality:
    """What the model's predictions on held-out text show, alone and against a reference."""

    corpus: str
    windows: int
    tokens: int
    perplexity: float
    bits_per_char: float
    unknown_share: float = 0.0  # of the windows' tokens: above UNK_MAX the text is not the model's language
    reference: str | None = None
    reference_perplexity: float | None = None
    same_ids: bool | None = None
    kl_mean: float | None = None
    top1_agreement: float | None = None
    kl_by_position: list[float] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list, metadata=NOT_JSON)


@torch.no_grad()
def _log_probs(model: Model, window: list[int]) -> torch.Tensor:
    """Log-probabilities (T, V) of each next token, fed the truth."""
    from ..loops.regress import forward_logits

    device = next(model.module.parameters()).device
    return torch.log_softmax(forward_logits(model.module, torch.tensor([window], device=device))[0].float(), dim=-1)


def measure_quality(model: Model, texts: list[str], corpus: str, reference: Model | None = None) -> Quality:
    """Perplexity of ``model`` on ``texts``; with ``reference`` (a loaded model), KL and top-1 per position."""
    found = token_windows(model.encode, texts, min(WINDOW_TOKENS, model.max_positions or WINDOW_TOKENS), WINDOWS)
    used, windows = [t for t, _ in found], [w for _, w in found]  # the first texts a window long, their first window
    if not windows:
        raise ValueError(f"no held-out text of {WINDOW_TOKENS} tokens to read")
    nll, ref_nll, kl, agree = 0.0, 0.0, torch.zeros(len(windows[0]) - 1), 0
    same = reference is None or all(reference.encode(t)[: len(w)] == w for t, w in zip(used, windows, strict=True))
    count = sum(len(w) - 1 for w in windows)
    unk_id = -1 if model.unk_id is None else model.unk_id
    chars = sum(len(model.decode(w[1:])) + w[1:].count(unk_id) for w in windows)  # an unknown token stands for one
    for w in windows:
        lp = _log_probs(model, w)[:-1]
        target = torch.tensor(w[1:], device=lp.device)
        nll -= lp.gather(1, target[:, None]).sum().item()
        if reference is not None and same:
            rp = _log_probs(reference, w)[:-1]
            v = min(lp.shape[-1], rp.shape[-1])  # padding rows beyond the vocabulary are never targets
            lp_v, rp_v = torch.log_softmax(lp[:, :v], -1), torch.log_softmax(rp[:, :v], -1)
            kl += (rp_v.exp() * (rp_v - lp_v)).sum(-1).clamp_min(0).cpu()
            agree += int((lp_v.argmax(-1) == rp_v.argmax(-1)).sum())
            ref_nll -= rp.gather(1, target[:, None]).sum().item()
    unk = sum(w.count(unk_id) for w in windows)
    q = Quality(corpus, len(windows), count, math.exp(nll / count), nll / max(1, chars) / math.log(2))
    q.unknown_share = unk / sum(len(w) for w in windows)
    if reference is not None:
        q.reference, q.same_ids = str(reference.source), same
        if same:
            q.reference_perplexity = math.exp(ref_nll / count)
            q.kl_by_position = [round(float(x) / len(windows), 5) for x in kl]
            q.kl_mean, q.top1_agreement = float(kl.sum()) / count, agree / count
    return q


def quality_findings(q: Quality, command: str) -> list[Finding]:
    """Against a reference: KL / top-1 decide (tokenizers that disagree are a bug); alone: the calibrated range."""
    ev = json_safe(q)
    if q.unknown_share > UNK_MAX:
        title = (
            f"quality not checked: the held-out {q.corpus} text is {q.unknown_share:.0%} unknown tokens for this "
            "tokenizer (not the model's language; give --reference with prompts of its own)"
        )
        return [Finding("quality", "quality.skipped", "info", title, ev, None, command)]
    if q.reference is not None:
        if not q.same_ids:
            title = f"the tokenizer differs from the reference's ({q.reference}): the same text gives other ids"
            return [Finding("quality", "quality.reference", "bug", title, ev, "same text, same ids", command)]
        assert q.kl_mean is not None and q.top1_agreement is not None
        crit = (
            f"mean KL(reference ‖ model) ≤ {KL_WARN} nats and top-1 agreement ≥ {TOP1_WARN:.0%} (a bug beyond "
            f"{KL_BUG} nats or below {TOP1_BUG:.0%}), teacher-forced on {q.tokens} held-out tokens"
        )
        worst = max(range(len(q.kl_by_position)), key=q.kl_by_position.__getitem__, default=0)
        said = (
            f"KL {q.kl_mean:.3f} nats/token, top-1 agreement {q.top1_agreement:.1%}, perplexity "
            f"{q.perplexity:.1f} vs the reference's {q.reference_perplexity:.1f} (worst position {worst})"
        )
        sev, how = "ok", "matches"
        if q.kl_mean > KL_BUG or q.top1_agreement < TOP1_BUG:
            sev, how = "bug", "diverges from"
        elif q.kl_mean > KL_WARN or q.top1_agreement < TOP1_WARN:
            sev, how = "warning", "drifts from"
        return [Finding("quality", "quality.reference", sev, f"output {how} the reference: {said}", ev, crit, command)]
    known = KNOWN_GOOD.get(q.corpus)
    if not known:
        title = (
            f"perplexity {q.perplexity:.1f} on held-out {q.corpus} text: not judged (no known-good model calibrated)"
        )
        return [Finding("quality", "quality.perplexity", "info", title, ev, None, command)]
    limit = round(BPC_FACTOR * max(known.values()), 3)
    crit = (
        f"bits per character on {q.windows} held-out {q.corpus} windows of {WINDOW_TOKENS} tokens at most "
        f"{BPC_FACTOR:g}× the worst known-good model's ({', '.join(f'{k}: {v:g}' for k, v in known.items())}); "
        "give --reference to compare with the original"
    )
    said = f"{q.bits_per_char:.3f} bits per character (perplexity {q.perplexity:,.1f}) on held-out {q.corpus} text"
    high = q.bits_per_char > limit
    title = f"{said}, within the known-good range (≤ {limit:g})"
    if high:
        title = (
            f"{said}, above the {limit:g} known-good models stay under: a corrupted weight, a config that disagrees "
            "with the weights or a wrong tokenizer"
        )
    return [Finding("quality", "quality.perplexity", "warning" if high else "ok", title, ev, crit, command)]


def quality_stage(run: DoctorRun) -> Quality:
    """:func:`measure_quality` on held-out human text of the model's language (the corpus the prompts come from),
    against ``--reference`` when given."""
    from ..corpus.inputs import corpus_of, held_out  # looked up at call time: tests choose the corpus
    from ..model.load import load_model

    model, opts = run.model, run.opts
    if model.tokenizer is None:
        raise StageSkipped("the model has no tokenizer: no text to read")
    corpus = corpus_of(model)
    texts = list(held_out(model, corpus, opts.plan.scan_prompts).texts)
    reference = load_model(opts.reference) if opts.reference else None
    q = measure_quality(model, texts, corpus, reference)
    ref = f" --reference {shlex.quote(opts.reference)}" if opts.reference else ""
    q.findings = quality_findings(q, f"genprobe doctor {run.arg} --only quality{ref} --out DIR")
    return q
