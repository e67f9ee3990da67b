"""Reports: PNG figures and one self-contained offline HTML page with the chapter's interactive experiments."""

from .figures import write_figures
from .html import render_report, write_report

__all__ = ["render_report", "write_figures", "write_report"]
