"""Jinja2 rendering shared by genprobe's HTML pages (the case study's report, the doctor's page, the loop pages):
``environment("genprobe.loops").get_template("repair.html.j2").render(report=r)``.

Templates live in ``<package>/templates/*.html.j2``, assets (CSS, JS) in ``<package>/assets/``, inlined with
``{{ asset("report.css") }}`` so every page stays ONE offline file. Everything interpolated is HTML-escaped unless
it is ``Markup`` (macros, ``asset``, ``|tojson``); undefined names raise instead of rendering as empty text.
"""

from __future__ import annotations

import base64
import re
from functools import lru_cache
from importlib import resources
from typing import Any

import jinja2
from markupsafe import Markup

DASH = "–"  # what a missing value looks like in every table
# Inlined CSS/JS must not be able to end the style/script element that holds it.
_CLOSING_TAG = re.compile(r"</(script|style)", re.IGNORECASE)


def num(x: Any, nd: int = 3) -> str:
    """A number for a table cell: thousands separators for ints, ``nd`` decimals (scientific when tiny/huge)."""
    if x is None:
        return DASH
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if x != 0 and (abs(x) < 10**-nd or abs(x) >= 1e6):
            return f"{x:.2e}"
        return f"{x:.{nd}f}"
    return str(x)


def pct(x: float | None) -> str:
    """A share as a percentage with one decimal."""
    return DASH if x is None else f"{100 * x:.1f}%"


def sci(x: float | None) -> str:
    """A (tiny) difference in scientific notation; an exact zero stays ``0.0`` so it reads as exact."""
    if x is None:
        return DASH
    return "0.0" if x == 0 else f"{x:.2e}"


def dash(x: Any) -> Any:
    """``x`` itself, or the dash when it is None."""
    return DASH if x is None else x


def index_by(rows: list[dict], key: str) -> dict:
    """``{row[key]: row}`` — look a row up by its key (the last row wins on duplicates)."""
    return {row[key]: row for row in rows}


def png_data_uri(data: bytes) -> str:
    """A PNG as a ``data:`` URI (the page must load nothing from elsewhere)."""
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def check_inlinable(name: str, text: str) -> str:
    """``text`` unchanged, or ValueError when it would end the script or style element holding it early."""
    if _CLOSING_TAG.search(text):
        raise ValueError(f"asset {name} contains '</script' or '</style' and cannot be inlined")
    return text


@lru_cache(maxsize=None)
def environment(package: str) -> jinja2.Environment:
    """The Jinja2 environment over ``<package>/templates`` (autoescaping, strict undefined, shared filters)."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader(package, "templates"),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html", "j2"), default_for_string=True, default=True),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=False,
    )
    env.filters.update(num=num, pct=pct, sci=sci, dash=dash, index_by=index_by, png_data_uri=png_data_uri)

    def asset(name: str) -> Markup:
        """The text of ``<package>/assets/<name>``, inlined verbatim (it is trusted package data)."""
        text = (resources.files(package) / "assets" / name).read_text(encoding="utf-8")
        return Markup(check_inlinable(name, text))

    env.globals["asset"] = asset
    # |tojson output sits inside script elements: Jinja escapes <, >, & and ' as \u00XX; keep it compact,
    # readable (no \u escapes for CJK text) and strict (NaN is not JSON).
    env.policies["json.dumps_kwargs"] = {"ensure_ascii": False, "separators": (",", ":"), "allow_nan": False}
    return env
