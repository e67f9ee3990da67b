"""Deliberately broken speculative decoders: each overrides one rule of
:class:`~genprobe.engine.speculative.SpeculativeDecoder` (production code carries no bug switches).

docs/speculative.md tables them with the check that catches each: the exact distribution of the first tokens has a
round of full acceptance and a rejection with positive probability, so it catches all six; greedy catches the bonus
and rollback mutants only when its run has such a round.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..engine.speculative import CachedModel, SpeculativeDecoder


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
