"""What a file given as a report.json is when it is another file of the report set (`python -m engine run --report
DIR` writes report.html, report.json, kernels.csv, steps.csv and trace.json side by side), so the reader can say
which file it is and which one to open instead of calling it damaged.

Recognised by how each writer starts its file: the CSVs by their first columns (profiling/export_csv.py's
STEP_COLUMNS and KERNEL_COLUMNS; tests/test_report_kinds.py keeps them equal), the page by its doctype
(profiling/export_html.py), the trace by its traceEvents (profiling/export_trace.py; any Chrome trace object).
"""
from __future__ import annotations

import re

STEP_CSV_START = ("mode", "step", "prefix_len")
KERNEL_CSV_START = ("mode", "name", "parent")
_TRACE_START = re.compile(rb'\s*\{\s*"traceEvents"\s*:')
_WHAT = {
    "trace.json": "the Chrome Trace Event timeline for Perfetto or chrome://tracing",
    "steps.csv": "the table of steps for a spreadsheet",
    "kernels.csv": "the table of timed ranges for a spreadsheet",
    "report.html": "the page for a browser",
}


def other_file(data: bytes, doc: object = None) -> str | None:
    """Which file of the report set data is, other than report.json ("trace.json", "steps.csv", "kernels.csv",
    "report.html"), from its first bytes, or from the parsed document doc where there is one; else None."""
    head = data[:4096].removeprefix(b"\xef\xbb\xbf")
    line = head.split(b"\n", 1)[0].rstrip(b"\r").decode("utf-8", "replace").split(",")
    if tuple(line[:3]) == STEP_CSV_START:
        return "steps.csv"
    if tuple(line[:3]) == KERNEL_CSV_START:
        return "kernels.csv"
    if head.lstrip()[:14].lower().startswith((b"<!doctype html", b"<html")):
        return "report.html"
    if _TRACE_START.match(head) or (isinstance(doc, dict) and "traceEvents" in doc and "schema_version" not in doc):
        return "trace.json"
    return None


def not_a_report(name: str, kind: str) -> str:
    """The message for a report-set file that is not report.json."""
    return (f"{name} is a {kind} ({_WHAT[kind]}), not a report.json: open the report.json in the same report "
            "directory; `python -m engine run --report DIR` writes the five files side by side.")
