"""The report: versioned JSON that the gate decides on; Markdown, HTML and JUnit are views (write.py
renders and writes all four)."""

from .model import (SCHEMA_VERSION, Check, ComparedWith, DeviceInfo, Gate, LineageStep, Report, ReportDiff,
                    SearchCandidate, SearchSection, VariantResult)

__all__ = ["SCHEMA_VERSION", "Check", "ComparedWith", "DeviceInfo", "Gate", "LineageStep", "Report", "ReportDiff",
           "SearchCandidate", "SearchSection", "VariantResult"]
