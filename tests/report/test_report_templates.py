"""The report's Jinja2 templates: shipped as package data, autoescaped, strict, and the only HTML source.

Reference for the escaping rules: jinja2's ``select_autoescape`` / ``htmlsafe_json_dumps``
(jinja2/utils.py) — ``|tojson`` escapes ``<``, ``>``, ``&`` and ``'`` so JSON cannot close its ``<script>``.
"""

from __future__ import annotations

import ast
import fnmatch
import json
import re
import tomllib
from importlib import resources
from pathlib import Path

import jinja2
import pytest

from genprobe._templates import environment as shared_environment
from genprobe.report.headline import seed_tables
from genprobe.report.html import render_report

REPO = Path(__file__).resolve().parents[2]
HOSTILE = '<img src=x onerror="alert(1)">&'


def environment() -> jinja2.Environment:
    """The report's environment: the shared one over ``genprobe/report/templates``."""
    return shared_environment("genprobe.report")


def render(name: str, **ctx) -> str:
    return environment().get_template(name).render(**ctx)


def test_every_template_is_package_data():
    """A template missing from pyproject's package-data works from a checkout and breaks once installed."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["genprobe.report"]
    folder = resources.files("genprobe.report") / "templates"
    names = [p.name for p in folder.iterdir() if p.name.endswith(".j2")]
    assert "report.html.j2" in names
    for name in names:
        assert any(fnmatch.fnmatch(f"templates/{name}", pat) for pat in patterns), name
    for name in ("report.css", "report.js"):
        assert any(fnmatch.fnmatch(f"assets/{name}", pat) for pat in patterns), name


def test_autoescaping_is_on_for_templates_and_strings():
    env = environment()
    assert all(env.autoescape(name) is True for name in env.list_templates())
    assert env.from_string("{{ x }}").render(x=HOSTILE) == "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;&amp;"


def test_undefined_names_raise_instead_of_rendering_empty():
    with pytest.raises(jinja2.UndefinedError):
        environment().from_string("{{ case.nope }}").render(case={})


def test_inlined_assets_cannot_close_their_element():
    asset = environment().globals["asset"]
    assert "</script" not in str(asset("report.js")).lower()
    from genprobe._templates import check_inlinable

    with pytest.raises(ValueError, match="cannot be inlined"):
        check_inlinable("evil.js", "let s = '</SCRIPT><b>';")


def _hostile_case(small_case: dict) -> dict:
    case = json.loads(json.dumps(small_case))
    d = case["decoding"]
    d["prompt"] = HOSTILE
    for r in d["rows"]:
        r["strategy"] = HOSTILE
        r["text_with_unk"] = HOSTILE + "<unk>"
    d["prompt_unknown_chars"] = [HOSTILE]
    d["rows_sampling_with_unk"] = [{"strategy": HOSTILE, "distinct_2": 0.5, "unk_share": 0.1}]
    d["other_prompts"] = [
        {
            "prompt": HOSTILE,
            "greedy": {"loop_unit": HOSTILE, "distinct_2": 0.1},
            "greedy_ban_unk": {
                "loop_unit": HOSTILE,
                "longest_repeat_text": HOSTILE,
                "distinct_2": 0.2,
                "text": HOSTILE,
            },
        }
    ]
    case["sampling"]["prompt"] = HOSTILE
    case["sampling"]["top10"][0]["token"] = HOSTILE
    case["exposure"]["teacher_forcing_rows"][0]["context"] = HOSTILE
    case["exposure"]["perturbation_passage"] = HOSTILE
    case["cache_bugs"][0]["impl"] = HOSTILE
    case["cache_bugs"][0]["verdict"] = HOSTILE
    case["cache_scaling"]["model"] = HOSTILE
    case["meta"]["torch"] = HOSTILE
    case["mask_noop"] = {HOSTILE: 0.5}
    return case


def test_every_interpolated_string_is_escaped(small_case):
    """Case data is untrusted text (decoded model output): none of it may become markup."""
    html = render_report(_hostile_case(small_case), seed_tables(), figures={})
    assert "<img src=x" not in html
    assert html.count("&lt;img src=x onerror=") >= 15
    # the <unk> marker is still turned into its quiet span after escaping
    assert '&amp;<span class="unk">&lt;unk&gt;</span>' in html


def _html_lines_in_python(path: Path) -> list[int]:
    tags = re.compile(
        r"</?(?:html|head|body|main|h[1-6]|p|div|span|table|tr|td|th|b|code|br|img|figure|nav|"
        r"label|input|output|select|option|button|canvas|script|style)\b[^<>]*>|<!doctype",
        re.I,
    )
    lines = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and tags.search(node.value):
            lines.add(node.lineno)
    return sorted(lines)


def test_no_hand_written_html_in_the_report_package():
    """HTML lives in templates/*.html.j2; Python only prepares data (issue 11: templates, never f-strings)."""
    found = {p.name: _html_lines_in_python(p) for p in (REPO / "src/genprobe/report").rglob("*.py")}
    assert not {k: v for k, v in found.items() if v}, found


def test_the_detector_finds_f_string_html(tmp_path):
    p = tmp_path / "x.py"
    p.write_text("x = 1\ny = f'<td class=\"num\">{x}</td>'\n")
    assert _html_lines_in_python(p) == [2]


def test_render_helper_renders_by_name():
    assert "<!doctype html>" in render("report.html.j2", **_minimal_context())


def _minimal_context() -> dict:
    return {"case": {}, "seed": {}, "figs": {}, "meta": {}, "seconds": {}, "headline": [], "findings": [], "data": {}}
