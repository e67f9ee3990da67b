"""The one rule for reduced-precision deployments (genprobe.serving.judge) and the statistics it reads, on
hand-made top-k responses: exact thresholds, -inf, a fault confined to one request."""

from __future__ import annotations

import pytest
import torch

from genprobe.engine.backend import Position, Response
from genprobe.serving.judge import GAP_BUG, GAP_PASS, Judge, gap_verdict, request_gap, served_positions
from genprobe.verify.compare import Thresholds

V = 6


def _response(prompt: list[int], generated: list[int], rows: dict[int, dict[int, float]]) -> Response:
    """A top-k response: ``rows`` maps a reference row to {id: served log p}; row r < P-1 is prompt position r+1."""
    P = len(prompt)

    def pos(token: int, r: int) -> Position:
        return Position(token, rows[r].get(token), rows[r])

    prompt_positions = [None] + [pos(prompt[r + 1], r) if r in rows else None for r in range(P - 1)]
    steps = [pos(t, P - 1 + s) for s, t in enumerate(generated)]
    return Response(prompt, generated, steps, "length", prompt_positions=prompt_positions)


def _served(resp: Response):
    return served_positions(resp, prompt=True) + served_positions(resp)


@pytest.mark.parametrize(
    ("ratio", "verdict"),
    [(GAP_PASS, "pass"), (GAP_PASS * 1.001, "suspicious"), (GAP_BUG, "suspicious"), (GAP_BUG * 1.001, "bug")],
)
def test_gap_verdict_at_its_exact_edges(ratio, verdict):
    assert gap_verdict(0.01 * ratio, 0.01, 1e-4) == (verdict, pytest.approx(ratio))


def test_a_floor_below_float_noise_reads_as_the_noise():
    """A precision exact on these tokens (floor 0) must not turn float noise into a bug."""
    assert gap_verdict(5e-5, 0.0, 1e-4)[0] == "pass"
    assert gap_verdict(float("inf"), 0.01, 1e-4)[0] == "bug"


def test_request_gap_reads_the_returned_ids_and_counts_matching_minus_inf_as_equal():
    ref = torch.full((3, V), -3.0)
    ref[0, 1], ref[2, 4] = float("-inf"), -1.0
    out = _response([0, 1, 2], [4], {0: {1: float("-inf"), 2: -3.5}, 1: {3: -2.0}, 2: {4: -1.25}})
    # |Δ| over (row 0: 0, 0.5), (row 1: 1.0), (row 2: 0.25) = 1.75 / 4 ids
    assert request_gap(_served(out), ref) == pytest.approx(1.75 / 4)
    honest = ref.clone()
    honest[1, 3] = -2.9
    assert request_gap(_served(out), ref, honest=honest) == pytest.approx(0.1 / 4)  # the floor: same ids, honest


def test_a_fault_in_one_request_decides_the_phase():
    """Each request over its own floor, the worst deciding: one broken request among honest ones is a bug."""
    ref = torch.full((3, V), -3.0)
    honest = ref + 0.01  # the precision moves every log p by 0.01
    ok = _response([0, 1, 2], [5], {2: {5: -2.99}})
    broken = _response([0, 1, 3], [5], {2: {5: -2.0}})
    judge = Judge(lambda ids: ref, Thresholds(), 5, floor=lambda ids: honest, exact=False)
    assert judge.phase("greedy", [ok, ok]).verdict == "pass"
    judged = judge.phase("greedy", [ok, broken, ok])
    assert judged.verdict == "bug" and judged.gap_ratio == pytest.approx(1.0 / 0.01)
    assert judged.judged_on == "gap" and judged.floor == pytest.approx(0.01)
