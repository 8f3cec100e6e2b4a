"""Stage: report.  A results folder in; report.md, report.html and figures out.

``data`` reads a study and its summary.csv into ReportData (no drawing); ``tables`` turns it
into sentences and tables; ``figures`` draws; ``render`` writes md + html from one block list;
``build`` is the single-study report, ``compare`` the overlay of several; ``bench_json`` exports
and imports ``vllm bench serve`` result files.
"""

from prefixstudy.report.build import build_report, parse_point
from prefixstudy.report.compare import build_compare
from prefixstudy.report.data import analyze

__all__ = ["analyze", "build_compare", "build_report", "parse_point"]
