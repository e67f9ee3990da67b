"""The one text table of the CLI (``genprobe.cli._common.table``): declared columns, aligned cells."""

from __future__ import annotations

from genprobe.cli import build_parser
from genprobe.cli._common import table


def test_columns_align_right_or_left_with_two_line_headers_and_a_rule():
    columns = [("name", -6, lambda r: r[0]), ("max |Δ|\nlogit", 8, lambda r: f"{r[1]:.2f}"), ("", -3, lambda r: r[2])]
    text = table(columns, [("a", 1.0, "ok"), ("bbbbbb", 12.345, "")], rule=True)
    assert text.splitlines() == [
        "name    max |Δ|",
        "          logit",
        "-" * (6 + 8 + 3 + 2),
        "a          1.00 ok",
        "bbbbbb    12.35",
    ]


def test_every_command_is_declared_once_with_its_help_and_json():
    """Each sub-command comes from one ``Command`` declaration: its help is its doc's first paragraph, and every leaf
    takes --json."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    helps = {c.dest: c.help for c in sub._choices_actions}
    assert (
        helps["verify-cache"]
        == "check that a KV-cache implementation is equivalent to recomputation (logits, not text)"
    )
    for name, p in sub.choices.items():
        leaves = [p]
        for a in p._actions:
            if a.__class__.__name__ == "_SubParsersAction":
                leaves = list(a.choices.values())
        for leaf in leaves:
            assert "--json" in leaf._option_string_actions, name
