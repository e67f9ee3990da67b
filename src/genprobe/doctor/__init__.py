"""``genprobe doctor MODEL``: everything genprobe can tell about a model and how it is run, in one report.

Stages (one module each): :mod:`.card` (model card and tokenizer facts), :mod:`.inference` (caches,
padding, serving), :mod:`.attention_health`, :mod:`.degeneration`, :mod:`.fixes` (which fix); :mod:`.run`
orchestrates them into a :class:`DoctorReport` and renders ``report.html``, :mod:`.options` turns its findings into
an exit status.
"""
