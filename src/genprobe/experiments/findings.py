"""The chapter's findings as checks on the case data: moved to :mod:`genprobe.report.findings` (the report renders
them); re-exported here so ``genprobe.experiments.findings`` imports keep working."""

from __future__ import annotations

from ..report.findings import Finding, findings

__all__ = ["Finding", "findings"]
