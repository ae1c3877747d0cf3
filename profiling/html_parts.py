"""The pieces report.html is built from: its stylesheet, escaping and number formatting, and tables. Every string that
reaches the page goes through e() (or a table cell built with it)."""
from __future__ import annotations

import html

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
h3 { font-size: 1em; margin: 1em 0 0.3em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
td, th { border: 1px solid #ddd; padding: 2px 6px; text-align: right; } th { background: #f4f4f4; }
td.name { text-align: left; font-family: monospace; white-space: pre; }
.ok { color: #2ca02c; font-weight: bold; } .bad { color: #d62728; font-weight: bold; }
.note { color: #666; font-size: 0.85em; } .lead { color: #444; margin-top: 0; }
.cards { display: flex; flex-wrap: wrap; gap: 1em; margin: 1em 0; }
.card { border: 1px solid #ddd; border-radius: 6px; padding: 0.6em 1em; min-width: 14em; }
.card .big { font-size: 1.6em; font-weight: bold; } .card .what { color: #666; font-size: 0.85em; }
pre.text { white-space: pre-wrap; background: #f8f8f8; border-radius: 4px; padding: 8px; font-size: 0.9em; }
pre.text .prompt { color: #888; }
details { margin-top: 2em; } summary { cursor: pointer; font-weight: bold; }
"""


def e(x: object) -> str:
    """str(x), HTML-escaped (quotes too, so it is safe in an attribute)."""
    return html.escape(str(x))


def fmt(x: object, digits: int = 3) -> str:
    """A table value: floats to `digits` places, None as a dash, anything else escaped."""
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return e(x)


def name_cell(text: object, title: str | None = None) -> str:
    hover = f' title="{e(title)}"' if title is not None else ""
    return f'<td class="name"{hover}>{e(text)}</td>'


def table(header: list[str], rows: list[list[str]], cls: str = "") -> str:
    """A table of already-built cells (<td> strings) under an escaped header."""
    head = "".join(f"<th>{e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><tr>{head}</tr>{body}</table>'
