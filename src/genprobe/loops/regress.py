"""Reading a model teacher-forced, as the loop tools do: uncached logits of whatever they are handed
(:func:`forward_logits`) over right-padded batches (:func:`pad_right`); the regression check of an edit (KL(base ‖
edited) of next-token distributions and loss on held-out text); and :class:`FrozenPrefix`, which lets a probe of an
edit of layers ≥ L skip the blocks below L (they compute what they did before the edit). Where the MLPs are is the
model's (:mod:`genprobe.model.arch`)."""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..model.arch import mlp_sites
from ..model.gpt import GPT


def forward_logits(model: Any, ids: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Uncached logits (B, T, V) for our GPT, a runner (``.full``), or a ``transformers`` causal LM."""
    if isinstance(model, GPT):
        return model(ids, attention_mask=valid)
    if hasattr(model, "full") and not isinstance(model, nn.Module):
        v = valid if valid is not None else torch.ones_like(ids, dtype=torch.bool)
        return model.full(ids, v)
    # no cache: one full forward (and the layers below an edit may be skipped, see FrozenPrefix)
    out = model(input_ids=ids, attention_mask=None if valid is None else valid.long(), use_cache=False)
    return out.logits if hasattr(out, "logits") else out[0]


def pad_right(seqs: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows right-padded to one width (real positions never see the padding), and the mask of real tokens."""
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    valid = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(list(s), dtype=torch.long)
        valid[i, : len(s)] = True
    return ids, valid


DEFAULT_WINDOW = 64  # the char GPT's context; long-context models are measured on windows of this length


def text_windows(ids: Sequence[int], width: int, max_windows: int) -> list[list[int]]:
    """The first ``max_windows`` non-overlapping windows of ``width`` tokens (the last partial one dropped)."""
    if width < 2:
        raise ValueError(f"window width must be >= 2, got {width}")
    ids = list(ids)
    n = min(len(ids) // width, max_windows)
    if n < 1:
        raise ValueError(
            f"the validation text is {len(ids)} tokens long, shorter than one regression window of {width} tokens "
            f"(the window length is the model's context, at most {DEFAULT_WINDOW}): give a longer validation text"
        )
    return [ids[i * width : (i + 1) * width] for i in range(n)]


class FrozenPrefix:
    """Per block, its outputs over a fixed sequence of forward calls of the unedited model, replayed by call order
    while an edit is measured (a call past the record raises); ``on=False``: nothing recorded or replayed."""

    def __init__(self, model: Any, on: bool = True):
        self.blocks = [s.block for s in mlp_sites(model)] if on else []
        self.outputs: list[list[Any]] = [[] for _ in self.blocks]

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        """Record every block's output of the forward calls made inside the block (the unedited model's)."""
        self.outputs = [[] for _ in self.blocks]
        with contextlib.ExitStack() as hooks:
            for out, b in zip(self.outputs, self.blocks, strict=True):
                hooks.callback(b.register_forward_hook(lambda m, i, o, out=out: out.append(o)).remove)
            yield

    @contextlib.contextmanager
    def skipping(self, first: int) -> Iterator[None]:
        """Blocks below ``first`` replay their recorded outputs instead of computing (the edit starts at ``first``)."""
        with contextlib.ExitStack() as restore:
            for i, block in enumerate(self.blocks[:first]):
                own = block.__dict__.get("forward")  # an instance-level forward (e.g. a wrapper) is put back
                restore.callback(*(delattr, block, "forward") if own is None else (setattr, block, "forward", own))
                block.forward = functools.partial(self._replay, i, iter(self.outputs[i]))
            yield

    @staticmethod
    def _replay(i: int, calls: Iterator[Any], *args: Any, **kwargs: Any) -> Any:
        """Block ``i``'s next recorded output (its ``forward`` while skipped)."""
        out = next(calls, None)
        if out is None:
            raise RuntimeError(f"block {i} was called more often than recorded: the measured inputs changed")
        return out


class RegressionProbe:
    """Base log-probs on fixed held-out windows, kept once; :meth:`measure` compares an edited model."""

    def __init__(self, model: Any, windows: Sequence[list[int]], batch_size: int = 64, reuse_prefix: bool = False):
        self.ids = torch.tensor([list(w) for w in windows], dtype=torch.long)
        if self.ids.dim() != 2 or self.ids.shape[1] < 2:
            raise ValueError("regression windows must be equal-length lists of >= 2 tokens")
        self.batch_size = batch_size
        self.prefix = FrozenPrefix(model, reuse_prefix)
        with self.prefix.recording():
            self.base_logp = self._logp(model)
        self.base_loss = self._loss(self.base_logp)

    @torch.no_grad()
    def _logp(self, model: Any) -> torch.Tensor:
        outs = []
        for s in range(0, self.ids.shape[0], self.batch_size):
            logits = forward_logits(model, self.ids[s : s + self.batch_size])
            outs.append(F.log_softmax(logits[:, :-1].float(), dim=-1).cpu())
        return torch.cat(outs)

    def _loss(self, logp: torch.Tensor) -> float:
        tgt = self.ids[:, 1:]
        return float(-logp.gather(-1, tgt[..., None]).mean())

    def measure(self, model: Any, first_layer: int = 0) -> "Regression":
        """Mean KL(base ‖ model) over positions and the loss change on the same windows (nats); ``first_layer``: the
        lowest layer the edit touches (with ``reuse_prefix`` the blocks below it replay their outputs)."""
        with self.prefix.skipping(first_layer):
            logp = self._logp(model)
        kl = (self.base_logp.exp() * (self.base_logp - logp)).sum(-1).mean()
        loss = self._loss(logp)
        return Regression(float(kl), loss, self.base_loss, loss - self.base_loss)


@dataclass(frozen=True)
class Regression:
    """What an edit costs on held-out text: KL(base ‖ edited) per position and the loss change, in nats."""

    kl: float
    loss: float
    base_loss: float
    dloss: float
