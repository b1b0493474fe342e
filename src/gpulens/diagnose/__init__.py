"""Diagnosis: name the bottleneck with evidence and the fixes in the order that pays."""

from gpulens.diagnose.base import DiagnoseScope, Finding, diagnose, register_analyzer

__all__ = ["DiagnoseScope", "Finding", "diagnose", "register_analyzer"]
