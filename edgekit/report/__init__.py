"""The report: versioned JSON that the gate decides on; Markdown, HTML and JUnit are views (write.py
renders and writes all four)."""

# they hand Report.diff and Report.write their functions (model.py imports no view): imported with
# the package, so before any of its modules is used
from . import diff, write  # noqa: F401
from .model import (
    SCHEMA_VERSION,
    Check,
    ComparedWith,
    DeviceInfo,
    Gate,
    LineageStep,
    Report,
    ReportDiff,
    SearchCandidate,
    SearchSection,
    VariantResult,
)

__all__ = [
    "SCHEMA_VERSION",
    "Check",
    "ComparedWith",
    "DeviceInfo",
    "Gate",
    "LineageStep",
    "Report",
    "ReportDiff",
    "SearchCandidate",
    "SearchSection",
    "VariantResult",
]
