"""``genprobe doctor MODEL``: everything genprobe can tell about a model and how it is run, in one report. One module
per stage; :mod:`.run` runs them into a :class:`DoctorReport` and renders ``report.html``; :mod:`.options` holds the
types they share and turns the findings into an exit status."""
