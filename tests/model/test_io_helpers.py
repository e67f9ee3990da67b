"""The layer-0 readers and writers every area shares (``genprobe._io``): JSON Lines in, figures out."""

from __future__ import annotations

import lzma

import pytest

from genprobe._io import figure_bytes, read_jsonl


def test_read_jsonl_numbers_lines_reads_xz_and_names_a_bad_line(tmp_path):
    p = tmp_path / "rows.jsonl.xz"
    with lzma.open(p, "wt", encoding="utf-8") as fh:
        fh.write('{"a": 1}\n\n"two"\n[3]\n')
    assert read_jsonl(p) == [(1, {"a": 1}), (3, "two"), (4, [3])]
    assert read_jsonl(p, limit=2) == [(1, {"a": 1}), (3, "two")]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\n{oops\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.jsonl: line 2 is not valid JSON"):
        read_jsonl(bad)


def test_figure_bytes_renders_and_closes_the_figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure()
    assert figure_bytes(fig).startswith(b"\x89PNG") and not plt.fignum_exists(fig.number)
    assert figure_bytes(plt.figure(), "svg").lstrip().startswith(b"<?xml")
