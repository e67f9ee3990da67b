"""Search choice rule and objective (an edit that only breaks exact periodicity must not win), scan aggregation,
prompt files and sets, contrast labels."""

import random

import pytest
import torch

from genprobe._io import json_safe
from genprobe.loops.contrast import position_labels
from genprobe.loops.patch import EditSpec, make_patch
from genprobe.loops.regress import Regression
from genprobe.loops.scan import GenerationRecord, ScanOptions, engine_batches, scan_batches, summarise
from genprobe.loops.search import Candidate, Limits, Objective, Strata, choose, grid, run_search
from genprobe.metrics.degeneracy import LoopSettings, detect_loop, measure_loops
from genprobe.model.arch import mlp_sites, state_sha256

PROSE = (
    "春江潮水連海平海上明月共潮生灩灩隨波千萬里何處春江無月明江流宛轉遶芳甸月照花林皆似霰空裏流霜不覺飛汀上白沙看不見"
)


@pytest.fixture(autouse=True)
def _single_thread():
    """Tiny models decode faster on one thread, and far faster on a shared, loaded machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ---- synthetic generations and the synthetic "edit" of issue 14 -------------------------------
LOOP_UNITS = ["肅肅嚴禋，肅肅肅肅。", "君不見君家。", "鳳凰鳴矣，于彼高岡。", "青青河畔草，", "一片冰心在玉壺。"]


def _looping(unit: str, start: int) -> list[str]:
    return (list(PROSE[start : start + 9]) + list(unit) * 12)[:57]


def _substitute_one_per_cycle(gen: list[str], period: int, onset: int) -> list[str]:
    """The gamed 'edit': in every cycle of the loop one token (another phase each cycle) becomes a new character."""
    out = list(gen)
    for k, start in enumerate(range(onset, len(out), period)):
        i = start + k % period
        if i < len(out):
            out[i] = chr(0x4E00 + k)
    return out


def _shift_one_per_cycle(unit: str, start: int) -> list[str]:
    """The other gamed 'edit': the unit grows by one repeated token each cycle (a shifting chant, no period)."""
    rng = random.Random(start)
    out = list(PROSE[start : start + 9])
    while len(out) < 57:  # 君不見。 君不見君， 君不見君家。 …: irregular lengths, so no period fits the tail
        out += list(unit[: rng.choice((3, 4, 5))]) + [rng.choice("，。")]
    return out[:57]


def _fixed(start: int) -> list[str]:
    return list((PROSE * 2)[start : start + 57])


def _measures(gens):
    return [measure_loops(g) for g in gens]


def test_substituting_one_token_per_cycle_is_not_rewarded_by_the_objective():
    """issue 14: the exact rate falls to 0 under the gamed edit; the objective the search minimises does not move."""
    prone = [_looping(u, i) for i, u in enumerate(LOOP_UNITS)]
    control = [_fixed(3 * i) for i in range(5)]
    strata = Strata(prone=5, control=5, prone_all=10, control_all=90)
    base = strata.objective(_measures(prone), _measures(control))
    assert base.loop_rate == base.degenerate_rate == pytest.approx(0.10)

    gamed = []
    for g in prone:
        info = detect_loop(g)
        gamed.append(_substitute_one_per_cycle(g, info.period, info.onset))
    after_gamed = strata.objective(_measures(gamed), _measures(control))
    assert after_gamed.loop_rate == 0.0  # the exact detector calls every chant fixed
    assert after_gamed.degenerate_rate == base.degenerate_rate  # the objective does not

    real = [_fixed(40 + i) for i in range(3)] + gamed[3:]  # three chants really broken, two only disguised
    after_real = strata.objective(_measures(real), _measures(control))
    assert after_real.degenerate_rate == pytest.approx(0.04)

    lim = Limits()
    reg = Regression(0.01, 4.0, 4.0, 0.0)
    gamed_c = Candidate(EditSpec((0,), 8, "subtract", 1.0), reg, after_gamed, 100)
    real_c = Candidate(EditSpec((1,), 8, "subtract", 1.0), Regression(0.05, 4.0, 4.0, 0.01), after_real, 400)
    assert choose([gamed_c], base, lim) is None  # alone, the disguise does not pass as a repair
    assert choose([gamed_c, real_c], base, lim) is real_c  # beside a real repair, it loses despite 0% exact loops


def test_shifting_the_unit_every_cycle_is_not_rewarded_either():
    """A chant whose unit grows/shrinks each cycle has no period (exact or near) but a repetitive tail."""
    prone = [_looping("君不見君家。", i) for i in range(4)]
    shifted = [_shift_one_per_cycle("君不見君家。", i) for i in (0, 1, 3, 4)]  # seed 2 happens to end exactly periodic
    for g in shifted:
        m = measure_loops(g)
        assert not m.looping and not m.near_looping  # both period detectors are dodged
        assert m.repetitive and m.degenerate  # the LZ compression of the tail is not
    control = _measures([_fixed(3 * i) for i in range(4)])
    strata = Strata(4, 4, 4, 36)
    base = strata.objective(_measures(prone), control)
    after = strata.objective(_measures(shifted), control)
    assert after.loop_rate == after.any_loop_rate == 0.0 and after.degenerate_rate == base.degenerate_rate
    assert (
        choose(
            [Candidate(EditSpec((0,), 8, "subtract", 1.0), Regression(0.0, 4.0, 4.0, 0.0), after, 10)], base, Limits()
        )
        is None
    )


def _build(model, dirs, units, gaps=None):
    """``spec -> patch`` of these directions (what repair's direction stage hands the search)."""
    return lambda spec: make_patch(model, spec, dirs, units, gaps)


def test_gamed_edit_loses_inside_run_search(tiny_model):
    """The same through run_search: a candidate's evaluation is the objective of the generations its edit yields."""
    sites = mlp_sites(tiny_model)
    torch.manual_seed(0)
    dirs = {layer: torch.randn(s.d_model) for layer, s in enumerate(sites)}
    units = {layer: torch.rand(s.d_ff) for layer, s in enumerate(sites)}
    w0 = {layer: s.down.weight.detach().clone() for layer, s in enumerate(sites)}
    prone = [_looping(u, i) for i, u in enumerate(LOOP_UNITS)]
    control = _measures([_fixed(3 * i) for i in range(5)])
    strata = Strata(5, 5, 10, 90)
    disguised = [_substitute_one_per_cycle(g, detect_loop(g).period, detect_loop(g).onset) for g in prone]

    def evaluate(m):
        edited = [layer for layer, s in enumerate(sites) if not torch.equal(s.down.weight, w0[layer])]
        # an edit of layer 0 only disguises the chants; an edit of layer 1 really breaks two of them
        gens = disguised if edited == [0] else [_fixed(40), _fixed(41)] + prone[2:]
        return Regression(0.01, 4.0, 4.0, 0.0), strata.objective(_measures(gens), control)

    specs = grid([(0,), (1,)], [4], ["project"], {"project": [1.0]})
    cands = run_search(tiny_model, specs, _build(tiny_model, dirs, units), evaluate)
    base = strata.objective(_measures(prone), control)
    by_layer = {c.spec.layers: c for c in cands}
    assert by_layer[(0,)].objective.loop_rate == 0.0 < by_layer[(1,)].objective.loop_rate
    assert choose(cands, base, Limits()).spec.layers == (1,)


def _cand(any_rate, kl, dloss, changed=100, exact=None, tag=""):
    obj = None if any_rate is None else Objective(any_rate, any_rate, any_rate if exact is None else exact, 0.0, 0, 0)
    reg = Regression(kl, 4.0, 4.0, dloss)
    return Candidate(EditSpec((0,), 4, "subtract", 1.0), reg, obj, changed, error=tag or None)


def test_choose_best_admissible_and_limits():
    lim = Limits(max_kl=0.1, max_dloss=0.02)
    base = Objective(0.3, 0.3, 0.3, 0.0, 0, 0)
    cs = [
        _cand(0.00, 0.50, 0.001, tag="too much KL"),
        _cand(0.01, 0.05, 0.030, tag="too much loss"),
        _cand(0.10, 0.09, 0.019, tag="ok but worse"),
        _cand(0.05, 0.02, 0.010, changed=400, tag="best, big"),
        _cand(0.05, 0.03, 0.010, changed=100, tag="best, small"),
        _cand(None, 0.01, 0.0, tag="not measured"),
    ]
    assert choose(cs, base, lim).error == "best, small"
    # equal degenerate and periodic rates: the lower exact rate wins before size
    assert (
        choose(
            [_cand(0.05, 0.0, 0.0, 10, exact=0.04, tag="a"), _cand(0.05, 0.0, 0.0, 999, exact=0.01, tag="b")], base, lim
        ).error
        == "b"
    )
    assert choose([_cand(0.1, 0.1, 0.02)], base, lim) is not None  # boundaries are inclusive
    assert choose([_cand(0.3, 0.01, 0.0), _cand(0.0, 0.2, 0.0)], base, lim) is None
    assert choose([], base, lim) is None


def test_strata_weights_and_validation():
    s = Strata(prone=2, control=4, prone_all=10, control_all=40)
    loop, clean = measure_loops(list("ab") * 20), measure_loops(list(PROSE[:40]))
    o = s.objective([loop, clean], [clean, clean, clean, loop])
    # prone: 1 of 2 still loops -> 5 of 10; controls: 1 of 4 new loop -> 10 of 40; (5 + 10) / 50
    assert o.degenerate_rate == pytest.approx(0.3) and o.prone_degenerate == 1 and o.control_degenerate == 1
    with pytest.raises(ValueError, match="expected 2 loop-prone"):
        s.objective([loop], [clean] * 4)


def test_grid_size_and_validation():
    alphas = {"subtract": [1, 2, 3, 4, 5], "project": [0.1, 0.2, 0.3, 0.4, 0.5]}
    specs = grid([(0,), (1,), (0, 1)], [8, 32], ["subtract", "project"], alphas)
    assert len(specs) == 3 * 2 * 2 * 5
    with pytest.raises(ValueError, match="no alpha grid"):
        grid([(0,)], [8], ["project"], {"subtract": [1.0]})
    with pytest.raises(ValueError, match="edit form"):
        EditSpec((0,), 4, "scale", 1.0)


def test_run_search_restores_model_and_reports_unbuildable(tiny_model):
    sites = mlp_sites(tiny_model)
    torch.manual_seed(0)
    dirs = {layer: torch.randn(s.d_model) for layer, s in enumerate(sites)}
    units = {layer: torch.rand(s.d_ff) for layer, s in enumerate(sites)}
    before = state_sha256(tiny_model)
    seen = []

    def evaluate(m):
        seen.append(state_sha256(m))
        return Regression(0.0, 1.0, 1.0, 0.0), None

    specs = grid([(0,), (1,)], [4], ["subtract"], {"subtract": [0.1, 2.0]})
    res = run_search(tiny_model, specs, _build(tiny_model, dirs, units, {0: 1.0, 1: 1.0}), evaluate)
    assert state_sha256(tiny_model) == before  # every candidate reverted exactly
    assert len(set(seen)) == len(specs)  # each candidate really evaluated an edited model
    assert all(c.weights_changed == 4 * 32 and c.error is None for c in res)
    units[0] = -torch.rand(sites[0].d_ff)  # never active in loops: the relative strength cannot be scaled
    bad = run_search(tiny_model, specs[:1], _build(tiny_model, dirs, units, {0: 1.0, 1: 1.0}), evaluate)
    assert bad[0].error and "non-positive mean activation" in bad[0].error and bad[0].objective is None
    row = json_safe(bad[0])
    assert row["degenerate_rate"] is None and row["kl"] is None and row["layers"] == [0]


# ---- scan ------------------------------------------------------------------------------------
def _rec(tokens, hit=True, chars=None):
    return GenerationRecord(
        [1], list(tokens), hit, 0.0, measure_loops(tokens), measure_loops(chars) if chars is not None else None
    )


def test_summarise_exact_near_any_rates_and_histograms():
    chant = _looping("君不見君家。", 0)
    disguised = _substitute_one_per_cycle(chant, 6, detect_loop(chant).onset)
    shifted = _shift_one_per_cycle("君不見君家。", 1)
    recs = [
        _rec([1, 2, 3] + [7, 8] * 10),
        _rec([5] * 3 + list(range(100, 110)) * 3),
        _rec(disguised),
        _rec(list(range(40))),
        _rec(list(range(50, 90)), hit=False),
        _rec(shifted),
    ]
    s = summarise(recs)
    assert (s.n, s.loops, s.near_loops, s.any_loops, s.repetitive, s.degenerate) == (6, 2, 3, 3, 3, 4)
    assert s.loop_rate == pytest.approx(2 / 6) and s.any_loop_rate == 0.5 and s.degenerate_rate == pytest.approx(4 / 6)
    assert s.short_loop_rate == pytest.approx(1 / 6) and s.long_loop_rate == pytest.approx(1 / 6)  # period 2 vs 10
    assert s.short_any_rate == pytest.approx(1 / 6) and s.long_any_rate == pytest.approx(2 / 6)  # + disguised period 6
    assert s.period_hist == {"2": 1, "10": 1} and s.near_period_hist == {"2": 1, "6": 1, "10": 1}
    assert s.onset_hist == {"0-7": 2} and s.length_capped_rate == pytest.approx(5 / 6)
    lo, hi = s.degenerate_rate_ci95
    assert lo < 4 / 6 < hi
    assert s.chars is None  # no record was decoded
    d = json_safe(s)
    assert d["chars"] is None and d["near_loop_rate"] == 0.5


def test_character_rates_when_every_record_is_decoded():
    recs = [_rec([1, 2] * 20, chars="ab" * 20), _rec(list(range(40)), chars=PROSE[:40])]
    s = summarise(recs)
    assert s.chars is not None and s.chars.n == 2 and s.chars.degenerate_rate == 0.5


def test_scan_on_tiny_model_batches_consistently(tiny_model):
    prompts = [[3, 4, 5], [6, 7], [8, 9, 10, 11], [12]]
    a = scan_batches(engine_batches(tiny_model), prompts, ScanOptions(20, batch_size=4))
    b = scan_batches(engine_batches(tiny_model), prompts, ScanOptions(20, batch_size=1))
    assert [r.tokens for r in a.records] == [r.tokens for r in b.records]
    assert a.summary.n == 4 and all(len(r.tokens) == 20 for r in a.records)
    for r in a.records:
        assert r.measures.looping == detect_loop(r.tokens).looping
        assert r.measures == measure_loops(r.tokens)
    assert not a.settings.eos_banned and a.settings.note is None


def test_scan_bans_the_end_token_and_says_so(tiny_model):
    """A loop study never stops at the end token: it is banned, the budget is fixed, and the settings say so."""
    prompts = [[3, 4, 5], [6, 7]]
    free = scan_batches(engine_batches(tiny_model), prompts, ScanOptions(24, batch_size=2, unk_id=None))
    eos = free.records[0].tokens[0]  # the token the model picks first: it would end generation at once
    res = scan_batches(engine_batches(tiny_model), prompts, ScanOptions(24, batch_size=2, eos_id=eos, unk_id=None))
    assert all(len(r.tokens) == 24 and eos not in r.tokens for r in res.records)
    assert res.settings.eos_banned and res.settings.eos_id == eos and eos in res.settings.sampler["ban_ids"]
    assert "banned" in res.settings.note and "24 new tokens" in res.settings.note


def test_contrast_labels_use_exact_or_near_loops():
    # prompt of 2 tokens + 9 generated: position t predicts generated index t+1-2
    m = measure_loops([9, 8, 7] + [1, 2] * 3, LoopSettings(min_tail=6))
    assert m.looping and (m.onset, m.period) == (3, 2)
    loop, ref = position_labels(2, 11, m)
    assert ref == [1, 2, 3]  # predicts generated 0,1,2 (before onset)
    assert loop == [6, 7, 8, 9]  # predicts generated 5.. (after the first unit)
    loop, ref = position_labels(2, 6, measure_loops([5, 6, 7, 8]))
    assert loop == [] and ref == [1, 2, 3, 4]
    chant = _looping("君不見君家。", 0)
    near = measure_loops(_substitute_one_per_cycle(chant, 6, detect_loop(chant).onset))
    assert not near.looping and near.near_looping
    loop, ref = position_labels(1, 58, near)  # a near loop is a loop for the contrast, not reference text
    assert len(loop) > 30 and all(t + 1 - 1 >= near.near_onset + 6 for t in loop)
    shifted = measure_loops(_shift_one_per_cycle("君不見君家。", 1))
    assert shifted.degenerate and not shifted.any_loop
    assert position_labels(1, 58, shifted) == ([], [])  # degenerate without an onset: neither class
