"""``genprobe doctor MODEL``: everything genprobe can tell about a model and how it is run, in one report.

Stages (one module each): :mod:`.card` (model card, :mod:`.tokenizer_facts`), :mod:`.inference` (caches,
padding, serving), :mod:`.attention_health`, :mod:`.degeneration`, :mod:`.fixes` (which fix); :mod:`.run`
orchestrates them into a :class:`DoctorReport` and renders ``report.html``, :mod:`.findings` turns its findings into
an exit status.
"""

from __future__ import annotations

from .findings import EXIT_BAD_INPUT, EXIT_BUG, EXIT_HEALTHY, EXIT_WARNINGS, Finding, Verdict
from .options import DoctorOptions
from .run import DoctorReport, run_doctor

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_BUG",
    "EXIT_HEALTHY",
    "EXIT_WARNINGS",
    "DoctorOptions",
    "DoctorReport",
    "Finding",
    "Verdict",
    "run_doctor",
]
