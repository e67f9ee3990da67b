"""The chapter's published figures: moved to :mod:`genprobe.report.seed` (the report prints them beside ours);
re-exported here so ``genprobe.experiments.seed`` imports keep working."""

from __future__ import annotations

from ..report.seed import seed_tables

__all__ = ["seed_tables"]
