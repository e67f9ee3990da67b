"""Jinja2 rendering of ``genprobe.report``'s own templates (the environment itself is :mod:`genprobe._templates`).

Templates live in this directory (``*.html.j2``); assets (CSS, JS) in ``genprobe/report/assets/``. Usage::

    from genprobe.report.templates import environment, render
    html = render("report.html.j2", case=case)                       # genprobe.report's own templates
    html = environment("genprobe.loops").get_template("x.html.j2").render(report=r)   # another package's

Everything interpolated is HTML-escaped unless it is ``Markup`` (macros, ``asset``, ``|tojson``);
undefined names raise instead of rendering as empty text.
"""

from __future__ import annotations

from typing import Any

import jinja2

from ..._templates import environment as shared_environment

__all__ = ["environment", "render"]


def environment(package: str = "genprobe.report") -> jinja2.Environment:
    """The shared Jinja2 environment over ``<package>/templates`` (this package's by default)."""
    return shared_environment(package)


def render(name: str, /, **ctx: Any) -> str:
    """Render ``genprobe.report``'s template ``name`` with ``ctx``."""
    return environment().get_template(name).render(**ctx)
