"""``genprobe doctor MODEL``: everything genprobe can tell about a model and how it is run, in one report. One module
per stage (:mod:`.audit`, :mod:`.card`, :mod:`.quality`, :mod:`.inference`, :mod:`.attention_health`,
:mod:`.degeneration`, :mod:`.fixes`); :mod:`.run` runs them into a :class:`DoctorReport` and renders
``report.html``; :mod:`.options` holds the types they share and turns the findings into an exit status.
"""
