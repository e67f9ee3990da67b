"""The scaled edit search (rank → screen → halving) and its teacher-forced loop probe."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from genprobe._io import json_safe
from genprobe.loops.contrast import position_labels
from genprobe.loops.pages import write_summary
from genprobe.loops.patch import EditSpec
from genprobe.loops.repair import repair
from genprobe.loops.scan import GenerationRecord
from genprobe.loops.search import LoopProbe, rung_sizes, scaled_layer_sets
from genprobe.loops.study import RepairConfig, RepairInputs
from genprobe.metrics.degeneracy import LoopSettings, measure_loops
from genprobe.model.load import load_model


def test_layer_sets_are_the_best_alone_then_together_then_all():
    assert scaled_layer_sets([5, 2, 7, 1], 10, 3) == [(5,), (2,), (7,), (2, 5), (2, 5, 7), tuple(range(10))]
    assert scaled_layer_sets([1, 0], 2, 3) == [(1,), (0,), (0, 1)]  # "best two" is "all": listed once
    assert scaled_layer_sets([4, 2], 8, 1) == [(4,), tuple(range(8))]
    assert scaled_layer_sets([0], 1, 3) == [(0,)]
    with pytest.raises(ValueError, match="top_layers must be >= 1"):
        RepairConfig(top_layers=0)


def test_rungs_double_the_prompts_and_end_on_the_whole_set():
    assert rung_sizes(32, 32, 8) == [(8, 8), (16, 16), (32, 32)]  # 8 → 4 → 2 candidates
    assert rung_sizes(32, 64, 8) == [(8, 16), (16, 32), (32, 64)]
    assert rung_sizes(12, 12, 8) == [(12, 12)]  # half of 12 is under 8 prone prompts: one rung, everyone
    assert rung_sizes(64, 0, 2) == [(64, 0)]  # two candidates: the last rung decides between them
    assert rung_sizes(64, 64, 16, min_prone=4) == [(8, 8), (16, 16), (32, 32), (64, 64)]


class _Teacher:
    """A 'runner' whose logits know the next token of the sequence it is shown: the loop token wins by ``margin``
    (negative: it loses by that much). It records the masks it was given."""

    def __init__(self, vocab: int, margin: float):
        self.vocab, self.margin, self.masks = vocab, margin, []

    def full(self, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        self.masks.append(valid.clone())
        logits = torch.zeros(*ids.shape, self.vocab)
        nxt = torch.roll(ids, -1, dims=1)
        logits.scatter_(-1, nxt[..., None], self.margin)
        return logits


def _record(prompt: list[int], tokens: list[int]) -> GenerationRecord:
    return GenerationRecord(prompt, tokens, True, 0.0, measure_loops(tokens, LoopSettings(min_tail=6)))


def test_the_loop_probe_reads_the_loop_token_at_loop_positions_only():
    looping = _record([9, 8], [7, 6] + [1, 2, 3] * 5)  # onset 2, period 3
    shorter = _record([9], [5] + [4, 4] * 5)  # a shorter sequence: padded in the batch
    no_loop = _record([9], list(range(10, 30)))
    probe = LoopProbe(_Teacher(32, 5.0), [no_loop, looping, shorter], max_seqs=8)
    assert probe.n_sequences == 2  # the non-looping record has no loop position and is left out
    expected = len(position_labels(2, 19, looping.measures)[0]) + len(position_labels(1, 12, shorter.measures)[0])
    assert probe.targets.numel() == expected > 0
    assert bool(probe.base_top.all())  # the teacher puts the loop token on top everywhere
    same = probe.measure(_Teacher(32, 5.0))
    assert same.dlogp == pytest.approx(0.0, abs=1e-6) and same.broken == 0.0
    weaker = probe.measure(_Teacher(32, 1.0))  # still on top, less likely
    assert weaker.dlogp < -1.0 and weaker.broken == 0.0
    flipped = _Teacher(32, -1.0)
    broke = probe.measure(flipped)  # no longer the top choice at any loop position
    assert broke.dlogp < weaker.dlogp and broke.broken == 1.0 and broke.positions == expected
    assert any(not bool(m.all()) for m in flipped.masks)  # the shorter row was masked as padding


def test_the_loop_probe_refuses_records_without_a_loop_onset():
    with pytest.raises(ValueError, match="--search exhaustive"):
        LoopProbe(_Teacher(32, 1.0), [_record([1], list(range(10, 30)))])


@pytest.fixture(autouse=True)
def _single_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


SMALL = RepairConfig(
    n_direction=160,
    n_search=96,
    n_validate=64,
    search_prone=8,
    search_control=8,
    ks=(4, 16),
    subtract_alphas=(0.5, 1.0),
    project_alphas=(1.0,),
    regression_windows=16,
    batch_size=64,
)


@pytest.mark.slow
def test_the_scaled_search_finds_the_exhaustive_searchs_edit_on_a_trained_model(trained_ckpt, tmp_path):
    """The shortcut is checked against the full grid: the same edit, or one at least as good on held-out prompts."""
    model = load_model(trained_ckpt)
    inputs = RepairInputs.tang(model.tokenizer, SMALL)
    full, _ = repair(model, inputs, replace(SMALL, search="exhaustive"))
    fast, _ = repair(model, inputs, replace(SMALL, search="scaled", top_layers=1))
    assert full.search.method == "exhaustive" and fast.search.method == "scaled"
    assert full.search.chosen is not None and fast.search.chosen is not None
    assert fast.validation is not None and full.validation is not None
    same = fast.search.chosen.spec == full.search.chosen.spec
    assert same or fast.validation.after.degenerate_rate <= full.validation.after.degenerate_rate
    trace = fast.search.scaled
    assert sorted(s.layer for s in trace.layer_scores) == [0, 1]
    assert trace.layer_sets[0] == (trace.layer_scores[0].layer,) and trace.layer_sets[-1] == (0, 1)
    assert trace.shortlisted <= SMALL.keep and trace.rungs[-1].prone == fast.search.strata.prone
    chosen = fast.search.chosen
    assert chosen.screen is not None and chosen.screen["dlogp"] < 0  # went on because its loop pressure dropped
    assert chosen.regression.kl <= SMALL.max_kl  # the full regression check, not only the screening one
    generated_for = sum(1 for c in full.search.candidates if c.objective is not None)
    assert trace.shortlisted < generated_for  # fewer edits generated for (wall time is too noisy to assert here)
    assert fast.locate is None and "locate" in full.timings_s and "locate" not in fast.timings_s  # ranked instead
    html = write_summary(json_safe(fast), tmp_path)["html"].read_text(encoding="utf-8")
    assert "Search (scaled)" in html and "halving rounds" in html


@pytest.mark.slow
def test_screening_reads_the_strongest_admissible_strengths_of_each_chain(trained_ckpt):
    model = load_model(trained_ckpt)
    cfg = replace(SMALL, search="scaled", max_kl=1e-9, n_validate=16)  # every edit is over this KL limit
    report, patch = repair(model, RepairInputs.tang(model.tokenizer, cfg), cfg)
    n_strengths = len(cfg.ks) * (len(cfg.subtract_alphas) + len(cfg.project_alphas))
    assert len(report.search.candidates) == len(report.search.scaled.layer_sets) * n_strengths  # all tried, down
    assert report.search.scaled.shortlisted == 0 and patch is None and report.search.chosen is None
    assert report.verdict.startswith("no edit passed")
    lenient = replace(SMALL, search="scaled", max_kl=10.0, max_dloss=10.0, n_validate=16, screen_strengths=1)
    report, _ = repair(model, RepairInputs.tang(model.tokenizer, lenient), lenient)
    probed = [c for c in report.search.candidates if "dlogp" in (c.screen or {})]
    assert len(probed) == len(report.search.candidates)  # the strongest is admissible: one strength per chain
    assert {c.spec.alpha for c in probed} == {max(SMALL.subtract_alphas), max(SMALL.project_alphas)}


@pytest.mark.slow
def test_an_interrupted_search_leaves_the_model_and_the_out_dir_untouched(trained_ckpt, tmp_path, monkeypatch):
    from genprobe.cli import main
    from genprobe.model.arch import state_sha256

    calls = {"n": 0}
    real = LoopProbe.measure

    def interrupted(self, model, first_layer=0):
        calls["n"] += 1
        if calls["n"] == 4:  # inside the screening, with an edit written into the weights
            raise KeyboardInterrupt
        return real(self, model, first_layer)

    monkeypatch.setattr(LoopProbe, "measure", interrupted)
    model = load_model(trained_ckpt)
    before = state_sha256(model.module)
    with pytest.raises(KeyboardInterrupt):
        repair(model, RepairInputs.tang(model.tokenizer, SMALL), replace(SMALL, search="scaled"))
    assert state_sha256(model.module) == before  # the edit being measured was written back
    calls["n"] = 0
    out = tmp_path / "out"
    small = ["--n-direction", "160", "--n-search", "96", "--n-validate", "16", "--search-prone", "8"]
    argv = ["loops", "repair", str(trained_ckpt), "--out", str(out), "--search", "scaled", *small, "--no-progress"]
    assert main(argv) == 130
    assert not out.exists() or not any(out.iterdir())  # no report, no patch, no partial file


@pytest.mark.parametrize("arch", ["gpt", "qwen2"])
def test_replayed_lower_layers_give_exactly_the_full_forward(arch, tiny_model, tmp_path):
    """An edit of layer 1 measured with layer 0 replayed equals the full forward; replaying the edited layer
    itself would not (so the replay really skips work), and extra calls are refused."""
    from genprobe.loops.patch import make_patch, write_values
    from genprobe.loops.regress import FrozenPrefix, RegressionProbe

    from .conftest import save_tiny_qwen2

    module = tiny_model.eval() if arch == "gpt" else load_model(save_tiny_qwen2(tmp_path / "q")).module
    torch.manual_seed(1)
    vocab = 50 if arch == "gpt" else 300
    windows = torch.randint(2, vocab, (6, 12)).tolist()
    d_model = 32
    d = {layer: torch.randn(d_model) for layer in range(2)}
    units = {layer: torch.rand(64) + 0.1 for layer in range(2)}
    fast = RegressionProbe(module, windows, batch_size=4, reuse_prefix=True)
    full = RegressionProbe(module, windows, batch_size=4)
    for layer in (0, 1):
        patch = make_patch(module, EditSpec((layer,), 8, "subtract", 3.0), d, units, {0: 1.0, 1: 1.0})
        write_values(module, patch, "new")
        try:
            want = full.measure(module)
            assert fast.measure(module, first_layer=layer) == want  # bit for bit
            if layer == 1:
                assert fast.measure(module, first_layer=2).kl != want.kl  # replaying the edited layer misses the edit
        finally:
            write_values(module, patch, "original")
    prefix = FrozenPrefix(module)
    with prefix.recording():
        from genprobe.loops.regress import forward_logits

        forward_logits(module, torch.tensor(windows[:2]))
    with prefix.skipping(1), pytest.raises(RuntimeError, match="called more often than recorded"):
        forward_logits(module, torch.tensor(windows[:2]))
        forward_logits(module, torch.tensor(windows[:2]))
    assert "forward" not in prefix.blocks[0].__dict__  # the class's forward is back


def test_halving_never_carries_an_edit_the_full_regression_check_refuses():
    """Edit A loops least on the search set but fails the full check: B and C go on, A is never kept."""
    from genprobe.loops.patch import Patch
    from genprobe.loops.regress import Regression
    from genprobe.loops.search import Candidate, Limits, Strata, full_regression_check, halve

    loop, clean = measure_loops([1, 2] * 20), measure_loops(list(range(40)))
    fixes = {1.0: 1.0, 2.0: 0.5, 3.0: 0.0}  # alpha -> share of loop-prone prompts the edit fixes
    current = {}

    def build(spec):
        current["alpha"] = spec.alpha
        return Patch([])

    def scan(ids):
        share = fixes[current["alpha"]]
        return [clean if (i[0] < 100 and (i[0] % 10) < 10 * share) or i[0] >= 100 else loop for i in ids]

    def measure(_model):
        return Regression(0.5 if current["alpha"] == 1.0 else 0.01, 1.0, 1.0, 0.0)

    cands = [Candidate(EditSpec((0,), 4, "subtract", a), Regression(0.0, 1.0, 1.0, 0.0)) for a in (1.0, 2.0, 3.0)]
    for c in cands:
        c.screen = {"windows": 2}
    prone, control = [[i] for i in range(16)], [[100 + i] for i in range(16)]
    check = full_regression_check(torch.nn.Linear(1, 1), build, measure, Limits(0.1, 0.02))
    final, rungs = halve(torch.nn.Linear(1, 1), cands, build, scan, prone, control, Strata(16, 16, 16, 16), check)
    assert [c.spec.alpha for c in final] == [2.0, 3.0] and rungs[0].kept == 2
    assert cands[0].screen["full_check"] is False and cands[0].regression.kl == 0.5  # measured, refused, dropped
    assert all(c.screen["full_check"] for c in final)
