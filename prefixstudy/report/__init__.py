"""Stage: report.  A results folder in; report.md, report.html and figures out."""

from prefixstudy.report.build import analyze, build_compare, build_report, parse_point

__all__ = ["analyze", "build_compare", "build_report", "parse_point"]
