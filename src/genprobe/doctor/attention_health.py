"""Attention health: per-head entropy and long-range mass on held-out text (one layers × heads heatmap) and the
heads that are dead (near-uniform), sink-only or position-only, each by a stated criterion, from
:func:`genprobe.attention.capture.capture_attention` and :func:`genprobe.attention.metrics.per_position`."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

import torch

from ..attention.capture import capture_attention
from ..attention.metrics import per_position
from .options import DoctorRun, Finding

MIN_KEYS = 8  # rows with fewer visible keys are left out of every head mean (a short row is near-uniform anyway)
DISTANCE = 8  # long-range mass: keys more than this many positions back
DEAD_ENTROPY = 0.95  # mean normalised entropy at or above this: near-uniform ("dead")
SINK_MASS = 0.9  # mean mass on the first token at or above this: sink-only
POSITION_TV = 0.1  # mean total variation between the maps on the text and on its tokens shuffled: position-only
DEAD_SHARE_WARN = 0.5  # this share of dead heads or more: the model looks untrained or broken
CRITERIA = {
    "dead": f"mean entropy / ln(visible keys) >= {DEAD_ENTROPY} over query rows with >= {MIN_KEYS} keys",
    "sink": f"mean mass on the first token >= {SINK_MASS} over those rows",
    "position": f"not dead nor sink, and the map on the text and on the same tokens shuffled differ by a mean total "
    f"variation <= {POSITION_TV}: the head attends by position, not content",
}


@dataclass
class HeadHealth:
    """One head's means over query rows with enough keys, and its flag (None: none)."""

    layer: int
    head: int
    norm_entropy: float
    far_mass: float
    sink_mass: float
    content_tv: float
    flag: str | None


@dataclass
class AttentionHealth:
    """Every head's health on one held-out text (``tokens`` long), the flagged heads and the criteria."""

    tokens: int
    text: str | None
    n_layer: int
    n_head: int
    implementation: str
    heads: list[HeadHealth]
    criteria: dict[str, str]
    findings: list[Finding] = field(default_factory=list)

    JSON_PROPERTIES = ("flagged",)

    @property
    def flagged(self) -> dict[str, list[tuple[int, int]]]:
        """(layer, head) of the heads carrying each flag (dead, sink, position)."""
        return {k: [(h.layer, h.head) for h in self.heads if h.flag == k] for k in CRITERIA}

    def grid(self) -> list[list[HeadHealth]]:
        """The heads as rows of layers (what the heatmap draws)."""
        return [[h for h in self.heads if h.layer == layer] for layer in range(self.n_layer)]


def _content_tv(a: torch.Tensor, b: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """(L, H) mean total variation between two captures' attention rows."""
    return 0.5 * (a[:, :, rows] - b[:, :, rows]).abs().sum(-1).mean(-1)


def _flag(ent: float, sink: float, tv: float) -> str | None:
    if ent >= DEAD_ENTROPY:
        return "dead"
    if sink >= SINK_MASS:
        return "sink"
    return "position" if tv <= POSITION_TV else None


def attention_health(run: DoctorRun) -> AttentionHealth:
    """Capture attention on held-out text and on its tokens shuffled; per-head means, flags, findings."""
    model, prompts = run.model, run.inputs.prompts
    length = min(run.opts.plan.attention_tokens, (model.max_positions or run.opts.plan.attention_tokens))
    ids: list[int] = []
    if model.tokenizer is not None and prompts:  # held-out text: the prompts joined, as many as fill ``length`` tokens
        sep, joined = "" if model.tokenizer.kind == "char" else " ", ""
        for p in prompts:  # (a tokenizer may warn past its limit)
            joined = joined + sep + p if joined else p
            if len(joined) >= 4 * length:
                break
        ids = model.encode(joined)[:length]
    if len(ids) < 2 * MIN_KEYS:  # a model without text: seeded random ids
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(2 if model.vocab_size > 3 else 0, model.vocab_size, (length,), generator=g).tolist()
    shuffled = [ids[i] for i in torch.randperm(len(ids), generator=torch.Generator().manual_seed(1)).tolist()]
    cap, other = capture_attention(model.module, ids), capture_attention(model.module, shuffled)
    pp = per_position(cap.probs, distance=DISTANCE)
    rows = pp["n_visible"] >= MIN_KEYS
    m = torch.stack([pp[k][:, :, rows].nanmean(-1) for k in ("norm_entropy", "far_mass", "sink_mass")], -1)
    means = torch.cat([m, _content_tv(cap.probs, other.probs, rows)[..., None]], -1).tolist()  # (L, H, 4)
    heads = [
        HeadHealth(layer, head, ent, far, sink, tv, _flag(ent, sink, tv))
        for layer, row in enumerate(means)
        for head, (ent, far, sink, tv) in enumerate(row)
    ]
    text = model.decode(ids) if model.tokenizer is not None and prompts else None
    res = AttentionHealth(len(ids), text, cap.n_layer, cap.n_head, cap.implementation, heads, dict(CRITERIA))
    what = f"--prompt {shlex.quote(text)}" if text is not None else "--ids " + " ".join(map(str, ids))
    command = f"genprobe attention heads {run.arg} {what} --distance {DISTANCE}"
    for flag, said in (("dead", "near-uniform (dead)"), ("sink", "sink-only"), ("position", "position-only")):
        hit, total = res.flagged[flag], len(heads)
        many = flag == "dead" and total and len(hit) / total >= DEAD_SHARE_WARN
        sev = "warning" if many else "info" if hit else "ok"
        where = ", ".join(f"L{layer}H{head}" for layer, head in hit[:12]) + (" …" if len(hit) > 12 else "")
        title = f"{len(hit)} of {total} heads {said}" + (f": {where}" if hit else "")
        crit = CRITERIA[flag] + (f"; {DEAD_SHARE_WARN:.0%} of heads or more dead warns" if flag == "dead" else "")
        res.findings.append(
            Finding("attention", f"heads.{flag}", sev, title, {"heads": hit, "of": total}, crit, command)
        )
    return res
