"""The report: versioned JSON that the gate decides on; Markdown (and later HTML/JUnit) are views."""

from .model import SCHEMA_VERSION, Check, Gate, Report, VariantResult

__all__ = ["SCHEMA_VERSION", "Check", "Gate", "Report", "VariantResult"]
