"""Deep models: every head in one layers × heads view (matrix, text grid, one figure), bounded capture memory."""

import struct

import pytest
import torch

from genprobe._io import json_safe
from genprobe.attention.capture import _stack_releasing, capture_attention, capture_bytes
from genprobe.attention.metrics import attention_report, head_matrix, head_stats, per_position
from genprobe.cli.cmd_attention import format_grid


def _fake_report(n_layer: int, n_head: int) -> dict:
    """A report dict whose far mass encodes (layer, head) so misplaced cells are visible."""
    heads = [
        {
            "layer": ly,
            "head": h,
            "entropy": 1.0,
            "norm_entropy": None if (ly, h) == (0, 0) else 0.5,
            "far_mass": (ly * n_head + h) / (n_layer * n_head),
            "sink_mass": 0.25,
            "diag_mass": 0.0,
            "local_mass": 0.0,
            "max_entropy": 2.0,
        }
        for ly in range(n_layer)
        for h in range(n_head)
    ]
    return {"n_layer": n_layer, "n_head": n_head, "heads": heads, "distance": 8, "local_window": 2, "seq_len": 42}


def test_head_matrix_puts_each_head_in_its_cell():
    rep = _fake_report(30, 9)
    m = head_matrix(rep, "far_mass")
    assert len(m) == 30 and all(len(row) == 9 for row in m)
    assert m[0][0] == 0.0 and m[0][8] == 8 / 270 and m[29][0] == 261 / 270 and m[29][8] == 269 / 270
    assert head_matrix(rep, "norm_entropy")[0][0] is None  # undefined stays undefined, never 0
    with pytest.raises(ValueError, match="unknown metric"):
        head_matrix(rep, "entropy_mean")


def test_format_grid_one_line_per_layer():
    ent, far, sink = format_grid(_fake_report(30, 9)).split("\n\n")  # GRID_METRICS, in order
    rows = far.splitlines()
    assert len(rows) == 2 + 30 and rows[1].split() == ["layer", *map(str, range(9))]
    assert rows[2 + 29].split() == ["29", *(f"{(261 + h) / 270:.2f}" for h in range(9))]
    assert ent.splitlines()[2].split()[:2] == ["0", "—"]


def test_per_position_layer_by_layer_matches_each_layer_alone():
    """The (L, H, T, T) input is reduced one layer at a time; each layer must equal that layer analysed alone."""
    T = 6
    uniform = torch.ones(T, T).tril()
    uniform = uniform / uniform.sum(-1, keepdim=True)
    sink = torch.zeros(T, T)
    sink[:, 0] = 1.0
    probs = torch.stack([torch.stack([uniform, torch.eye(T)]), torch.stack([sink, uniform])])  # (2, 2, T, T)
    whole = per_position(probs, distance=2)
    for layer in range(2):
        alone = per_position(probs[layer], distance=2)
        for k in ("entropy", "far_mass", "sink_mass", "diag_mass", "local_mass"):
            assert torch.equal(whole[k][layer], alone[k][0]), (layer, k)
    stats = {(s.layer, s.head): s for s in head_stats(probs, distance=2)}
    assert stats[(0, 1)].diag_mass == 1.0 and stats[(1, 0)].sink_mass == 1.0 and stats[(1, 0)].entropy == 0.0


def test_capture_refuses_maps_over_the_memory_limit(tiny_model):
    ids = list(range(1, 9))
    need = capture_bytes(tiny_model.cfg.n_layer, tiny_model.cfg.n_head, len(ids))
    assert need == tiny_model.cfg.n_layer * tiny_model.cfg.n_head * 8 * 8 * 4
    assert capture_bytes(30, 9, 42) == 1_905_120  # SmolLM2-135M on the default prompt
    assert capture_attention(tiny_model, ids, max_bytes=need).probs.shape[-1] == 8
    with pytest.raises(ValueError, match="over the .* limit; use a shorter prompt"):
        capture_attention(tiny_model, ids, max_bytes=need - 1)


def test_stack_releasing_copies_and_drops_each_layer():
    maps = [torch.rand(1, 3, 4, 4) for _ in range(5)]
    expected = torch.stack([m[0] for m in maps])
    held = list(maps)
    out = _stack_releasing(held)
    assert torch.equal(out, expected) and held == [None] * 5


def _png_size(path) -> tuple[int, int]:
    with open(path, "rb") as f:
        head = f.read(24)
    return struct.unpack(">II", head[16:24])


def test_heads_grid_is_one_readable_figure_at_any_depth(tmp_path):
    from genprobe.attention.plots import heads_grid_plot

    small = _png_size(heads_grid_plot(_fake_report(2, 2), tmp_path / "small.png"))
    smol = _png_size(heads_grid_plot(_fake_report(30, 9), tmp_path / "smol.png"))
    huge = _png_size(heads_grid_plot(_fake_report(72, 24), tmp_path / "huge.png"))
    assert smol[1] > small[1]  # grows with depth …
    assert huge[0] <= 3 * 8.0 * 110 * 1.1 and huge[1] <= 14.0 * 110 * 1.1  # … up to a cap (inches × dpi)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["huge.png", "small.png", "smol.png"]


def test_report_of_a_capture_has_one_head_entry_per_cell(tiny_model):
    rep = json_safe(attention_report(capture_attention(tiny_model, [1, 2, 3, 4, 5])))
    m = head_matrix(rep, "entropy")
    assert [[c is not None for c in row] for row in m] == [[True] * rep["n_head"]] * rep["n_layer"]
