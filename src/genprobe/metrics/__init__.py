"""Degeneration metrics: distinct-n, seq-rep-n, longest repeated n-gram, ``<unk>`` share, exact and near loops."""
