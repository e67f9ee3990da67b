"""Synthetic long-range generators place key/value at the requested distance; a tiny smoke run."""

import json

import pytest
import torch

from genprobe._io import json_safe
from genprobe.attention.longrange import (
    CorpusExtrapolationConfig,
    LagTask,
    LongRangeConfig,
    PasskeyTask,
    SyntheticConfig,
    lag_accuracy,
    passkey_accuracy,
    run_longrange,
    train_synthetic,
    window_losses,
)


def test_passkey_places_value_at_distance():
    task = PasskeyTask()
    gen = torch.Generator().manual_seed(0)
    d = torch.tensor([1, 5, 14, 30])
    x, y = task.batch(d, 32, gen)
    assert x.shape == (4, 32)
    for row, dist, val in zip(x, d.tolist(), y.tolist(), strict=True):
        q = 31
        assert int(row[q]) == task.QUERY
        assert int(row[q - dist]) == val and task.VALUE0 <= val < task.vocab_size
        assert int(row[q - dist - 1]) == task.KEY
        assert int((row == task.KEY).sum()) == 1
        assert int((row >= task.VALUE0).sum()) == 1  # the value occurs once: content alone finds it
    with pytest.raises(ValueError, match="distances"):
        task.batch(torch.tensor([31]), 32, gen)


def test_lag_targets_are_tokens_k_back():
    task = LagTask(3)
    gen = torch.Generator().manual_seed(1)
    x, y = task.sample(4, 16, gen)
    assert (y[:, :3] == -100).all()
    assert torch.equal(y[:, 3:], x[:, :13])
    with pytest.raises(ValueError, match="lag"):
        LagTask(0)
    with pytest.raises(ValueError, match="places after"):
        task.sample(2, 3, gen)


def test_learned_positions_beyond_context_raise_the_models_error():
    sc = SyntheticConfig(
        context=8, model=dict(d_model=16, n_head=2, d_ff=32), passkey_steps=2, lag_steps=2, lags=(1,), batch_size=4
    )
    task = PasskeyTask()
    model, summary = train_synthetic(task, "learned", sc)
    assert summary.steps == 2
    with pytest.raises(ValueError, match="context"):
        passkey_accuracy(model, task, 12, 14, samples=4)
    assert 0.0 <= passkey_accuracy(model, task, 3, 8, samples=4) <= 1.0
    rope, _ = train_synthetic(task, "rope", sc)
    assert isinstance(passkey_accuracy(rope, task, 12, 14, samples=4), float)
    lag_model, _ = train_synthetic(LagTask(1), "learned", sc)
    with pytest.raises(ValueError, match="context"):
        lag_accuracy(lag_model, LagTask(1), 16, 8, samples=4)
    assert 0.0 <= lag_accuracy(lag_model, LagTask(1), 8, 8, samples=4) <= 1.0


class _PasskeyReader(torch.nn.Module):
    """A constructed model: at the last position, all logit mass on the token ``offset`` after the KEY (1: the
    value, the right answer; 0: the KEY itself, always wrong)."""

    def __init__(self, offset: int):
        super().__init__()
        self.offset = offset

    def forward(self, x):
        key = (x == PasskeyTask.KEY).int().argmax(-1)
        picked = x[torch.arange(x.shape[0]), key + self.offset]
        logits = torch.zeros(*x.shape, PasskeyTask.vocab_size)
        logits[:, -1] = torch.nn.functional.one_hot(picked, PasskeyTask.vocab_size).float()
        return logits


@pytest.mark.parametrize("distance, length", [(1, 8), (5, 16), (30, 32)])
def test_passkey_accuracy_on_models_whose_answer_is_known(distance, length):
    task = PasskeyTask()
    # reads the value after the key: every answer right, over several batches (300 samples, batches of 128)
    assert passkey_accuracy(_PasskeyReader(1), task, distance, length, samples=300, batch=128) == 1.0
    # reads the key itself: never a value token, every answer wrong
    assert passkey_accuracy(_PasskeyReader(0), task, distance, length, samples=300, batch=128) == 0.0


def test_passkey_accuracy_is_the_share_of_right_answers():
    """A model right on values of one parity only: the accuracy is that parity's share of the samples."""
    task = PasskeyTask()

    class EvenOnly(_PasskeyReader):
        def forward(self, x):
            logits = super().forward(x)
            value = logits[:, -1].argmax(-1)
            odd = value % 2 == 1
            logits[odd, -1] = torch.roll(logits[odd, -1], 1, dims=-1)  # odd values: the next token instead
            return logits

    samples, distance, length = 400, 4, 12
    gen = torch.Generator().manual_seed(1234 + 7919 * distance + length)  # the metric's own draw
    values = torch.cat([task.batch(torch.full((n,), distance), length, gen)[1] for n in (256, 144)])
    expected = float((values % 2 == 0).float().mean())
    assert 0.3 < expected < 0.7
    assert passkey_accuracy(EvenOnly(1), task, distance, length, samples=samples) == pytest.approx(expected)


def test_lag_accuracy_counts_only_positions_beyond_context():
    class Oracle(torch.nn.Module):  # perfect before position 8, always wrong from position 8 on
        def forward(self, x):
            y = torch.roll(x, 1, dims=1)
            logits = torch.nn.functional.one_hot(y, LagTask.vocab_size).float()
            logits[:, 8:] = torch.roll(logits[:, 8:], 1, dims=-1)
            return logits

    assert lag_accuracy(Oracle(), LagTask(1), 8, 8, samples=4) == 1.0
    assert lag_accuracy(Oracle(), LagTask(1), 16, 8, samples=4) == 0.0


def test_window_losses_learned_refuses_long_windows(tiny_model):
    ids = torch.randint(0, 50, (200,))
    r = window_losses(tiny_model, ids, 16, context=32)
    assert r.loss_beyond_context is None and r.windows == 12
    with pytest.raises(ValueError, match="context"):
        window_losses(tiny_model, ids, 64, context=32)


@pytest.fixture(scope="module")
def smoke():
    """A tiny run of everything: learned (refuses rows past its table) beside ALiBi (does not)."""
    lc = LongRangeConfig(
        pos_encodings=["learned", "alibi"],
        synthetic=SyntheticConfig(
            context=8,
            model=dict(d_model=16, n_head=2, d_ff=32),
            passkey_steps=3,
            lag_steps=2,
            lags=(1, 3),
            batch_size=8,
            eval_samples=8,
        ),
        corpus=CorpusExtrapolationConfig(
            context=16,
            eval_lengths=(8, 16, 32),
            steps=2,
            batch_size=4,
            warmup=1,
            max_val_tokens=256,
            poems=60,
            model={"n_layer": 1, "n_head": 2, "d_model": 16, "d_ff": 32},
        ),
    )
    return run_longrange(lc)


def test_smoke_run_longrange(smoke):
    res = smoke
    syn = res.synthetic
    # learned positions refuse rows past their table: None in the number, the model's error in `errors`
    assert syn.passkey["learned"].accuracy[30] is None
    assert any(e.at == "distance 30 (rows of 32)" and "context" in e.message for e in syn.passkey["learned"].errors)
    assert isinstance(syn.passkey["alibi"].accuracy[30], float) and not syn.passkey["alibi"].errors
    corp = res.corpus.encodings
    assert corp["learned"].by_length[32] is None and [e.at for e in corp["learned"].errors] == ["windows of 32"]
    assert isinstance(corp["alibi"].by_length[32].loss, float)
    assert res.summary["learned"].passkey_mean_beyond is None
    assert isinstance(res.summary["alibi"].passkey_mean_beyond, float)
    assert set(syn.lag["alibi"].accuracy[16]) == {1, 3}
    assert syn.lag["learned"].accuracy[32][3] is None
    assert res.errors["learned"] and not res.errors["alibi"]
    # the JSON form: same layout as before, numbers or null, never a string in a numeric field
    d = json.loads(json.dumps(json_safe(res), allow_nan=False))
    tasks = d["synthetic"]["tasks"]
    assert set(tasks) == {"passkey", "lag"}
    assert tasks["passkey"]["encodings"]["learned"]["accuracy"]["30"] is None
    assert d["corpus"]["encodings"]["learned"]["by_length"]["32"] is None
    assert d["summary"]["learned"]["passkey_mean_beyond"] is None
    assert set(d["summary"]["alibi"]) >= {"passkey_min_inside", "lag_mean_len16", "val_loss_len32"}
    assert not [v for v in _leaves(d["synthetic"]["tasks"]) if isinstance(v, str) and v.startswith("error")]
    with pytest.raises(ValueError, match="position encodings"):
        run_longrange(LongRangeConfig(pos_encodings=["sinusoidal"]))


def _leaves(x):
    if isinstance(x, dict):
        for v in x.values():
            yield from _leaves(v)
    elif isinstance(x, list):
        for v in x:
            yield from _leaves(v)
    else:
        yield x


def test_text_tables_and_plot_show_refusals(smoke, tmp_path):
    from genprobe.attention.plots import longrange_plot
    from genprobe.cli.cmd_longrange import format_results

    text = format_results(smoke)
    learned = next(line for line in text.splitlines() if line.strip().startswith("learned |"))
    assert learned.split()[-1] == "err"  # distance 30 > context: refused, shown as err, not a number
    assert "learned (distance 10 (rows of 12)): " in text  # the first refusal, with the model's own message
    assert "alibi (" not in text
    assert "error" in next(line for line in reversed(text.splitlines()) if line.strip().startswith("learned |"))
    assert longrange_plot(smoke, tmp_path / "lr.png").stat().st_size > 10_000


def test_pe_list_is_space_separated():
    from genprobe.cli import build_parser

    assert build_parser().parse_args(["longrange", "--pe", "learned", "alibi"]).pe == ["learned", "alibi"]
    assert build_parser().parse_args(["longrange"]).pe == ["learned", "rope", "alibi"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["longrange", "--pe", "learned,rope"])
