"""report.html: one self-contained page (plotly.js inlined, inline CSS, no external references) that reads
offline: summary, kernel breakdown, per-step timelines, acceptance, token diff and chosen steps' trees."""
from __future__ import annotations

import html

from engine.records import RunRecord, StepRecord

from .capture_data import Capture
from .charts import acceptance_figure, figure_div, position_figure, stage_figure, timeline_figure
from .environment import environment
from .figures import tree_figure
from .metrics import kernel_table, summarize

MAX_TREES = 4
MAX_OPS = 25
CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
td, th { border: 1px solid #ddd; padding: 2px 6px; text-align: right; } th { background: #f4f4f4; }
td.name { text-align: left; font-family: monospace; white-space: pre; }
.ok { color: #2ca02c; font-weight: bold; } .bad { color: #d62728; font-weight: bold; }
.tokens td { text-align: center; font-family: monospace; } .tokens td.diff { background: #f8c8c8; }
.note { color: #666; font-size: 0.85em; }
"""


def _e(x: object) -> str:
    return html.escape(str(x))


def _fmt(x: object, digits: int = 3) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return _e(x)


def _table(header: list[str], rows: list[list[str]], cls: str = "") -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(rows_cell for rows_cell in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><tr>{head}</tr>{body}</table>'


def summary_section(s: dict, env: dict, ar: RunRecord, dd: RunRecord) -> str:
    verdict = ('<span class="ok">greedy-exact: DDTree emitted exactly the AR tokens</span>' if s["greedy_exact"]
               else '<span class="bad">NOT greedy-exact: DDTree diverged from AR</span>')
    items = [("generated tokens", s["num_generated"]), ("DDTree steps", s["num_steps"]),
             ("AR steps", s["ar_num_steps"]), ("budget B", s["budget"]), ("block size", s["block_size"]),
             ("tau (tokens/step, bonus incl.)", s["tau"]), ("AR tokens/s", s["ar_tokens_per_s"]),
             ("DDTree tokens/s", s["ddtree_tokens_per_s"]), ("speedup", s["speedup"]),
             ("AR time (ms)", s["ar_time_ms"]), ("DDTree time (ms)", s["ddtree_time_ms"]),
             ("drafter", dd.drafter), ("prompt", ar.prompt)]
    rows = [[f'<td class="name">{_e(k)}</td>', f"<td>{_fmt(v)}</td>"] for k, v in items]
    env_line = ", ".join(f"{k}: {v}" for k, v in env.items())
    return (f"<h2>Summary</h2><p>{verdict}</p>{_table(['metric', 'value'], rows)}"
            "<p class='note'>tokens/s = generated tokens (the prefill's included) / host wall time of the prefill "
            "plus every step (each step's time includes reading its record back to the host).</p>"
            f"<p class='note'>{_e(env_line)}</p>")


def kernel_section(rows: list[dict], capture: Capture | None) -> str:
    on_device = capture is not None and "cuda" in capture.activities
    header = ["mode", "range", "count", "total ms", "mean ms", "p50 ms", "p95 ms", "self ms", "share"]
    header += (["profiler host ms"] if capture is not None else []) + (["device ms"] if on_device else [])
    body = []
    for r in rows:
        name = "  " * r["depth"] + r["name"][len(r["parent"]) + 1:] if r["parent"] else r["name"]
        cells = [r["mode"], None, r["count"], r["total_ms"], r["mean_ms"], r["p50_ms"], r["p95_ms"], r["self_ms"]]
        row = [f"<td>{_fmt(c)}</td>" for c in cells]
        row[1] = f'<td class="name" title="{_e(r["name"])}">{_e(name)}</td>'
        row.append(f"<td>{r['share']:.1%}</td>" if r["share"] is not None else "<td>–</td>")
        if capture is not None:
            row.append(f"<td>{_fmt(r['profiler_cpu_ms'])}</td>")
        if on_device:
            row.append(f"<td>{_fmt(r['device_ms'])}</td>")
        body.append(row)
    return ("<h2>Kernel breakdown</h2><p class='note'>One row per timed range, indented under its parent; share = "
            "the range's total / the total step time (nested rows add up within their parent). Hover a name for "
            "its full range.</p>" + _table(header, body))


def token_diff_section(s: dict, dd: RunRecord) -> str:
    ar_tokens, dd_tokens = s["ar_tokens"], s["ddtree_tokens"]
    n = max(len(ar_tokens), len(dd_tokens))
    cells = {"position": [], "AR": [], "DDTree": []}
    for i in range(n):
        a = ar_tokens[i] if i < len(ar_tokens) else ""
        d = dd_tokens[i] if i < len(dd_tokens) else ""
        cls = "" if a == d else ' class="diff"'
        cells["position"].append(f"<td>{i}</td>")
        cells["AR"].append(f"<td{cls}>{_e(a)}</td>")
        cells["DDTree"].append(f"<td{cls}>{_e(d)}</td>")
    rows = "".join(f"<tr><th>{k}</th>{''.join(v)}</tr>" for k, v in cells.items())
    div = s["first_divergence"]
    text = ("no divergence" if div is None else
            f"first divergence at position {div['position']} (DDTree step {_fmt(div['ddtree_step'])}): AR token "
            f"{_fmt(div['ar_token'])}, DDTree token {_fmt(div['ddtree_token'])}; AR top-1 minus top-2 logit there: "
            f"{_fmt(div['logit_gap'], 4)}, DDTree token below the AR top-1 by {_fmt(div['ddtree_token_gap'], 4)}")
    return f"<h2>Token diff</h2><p>{_e(text)}</p><table class='tokens'>{rows}</table>"


def chosen_steps(dd: RunRecord, summary: dict) -> list[StepRecord]:
    """The first step, the longest and the shortest acceptance, and the step where DDTree diverged."""
    if not dd.steps:
        return []
    picks = [dd.steps[0], max(dd.steps, key=lambda s: s.num_accepted), min(dd.steps, key=lambda s: s.num_accepted)]
    div = summary["first_divergence"]
    if div is not None and div["ddtree_step"] is not None:
        picks.append(dd.steps[div["ddtree_step"]])
    unique = {s.index: s for s in picks}
    return [unique[i] for i in sorted(unique)][:MAX_TREES]


def ops_section(capture: Capture) -> str:
    on_device = "cuda" in capture.activities
    parts = []
    for mode, rc in capture.runs.items():
        rows = []
        for o in rc.ops[:MAX_OPS]:
            row = [f'<td class="name">{_e(o.range)}</td>', f'<td class="name">{_e(o.name)}</td>',
                   f"<td>{o.count}</td>", f"<td>{_fmt(o.cpu_ms)}</td>"]
            rows.append(row + ([f"<td>{_fmt(o.device_ms)}</td>"] if on_device else []))
        header = ["range", "op", "calls", "host ms"] + (["device ms"] if on_device else [])
        parts.append(f"<h3>{_e(mode)}</h3>" + _table(header, rows))
    return (f"<h2>torch.profiler capture ({_e(', '.join(capture.activities))})</h2><p class='note'>Top-level ops "
            "called directly inside each range, by time; timer numbers of a captured run include the profiler's "
            "overhead.</p>" + "".join(parts))


def render(ar: RunRecord, dd: RunRecord, capture: Capture | None = None) -> bytes:
    s = summarize(ar, dd)
    env = environment(str(dd.decode["device"]))
    rows = kernel_table(ar, capture) + kernel_table(dd, capture)
    figures = [stage_figure(rows), timeline_figure(ar), timeline_figure(dd), acceptance_figure(s),
               position_figure(s), *(tree_figure(step) for step in chosen_steps(dd, s))]
    divs = [figure_div(f, include_plotlyjs=(i == 0)) for i, f in enumerate(figures)]
    num_trees = len(figures) - 5
    body = "".join([
        f"<h1>DDTree Studio report</h1><p class='note'>model: {_e(dd.model)}<br>decode: {_e(dd.decode)}</p>",
        summary_section(s, env, ar, dd),
        kernel_section(rows, capture), divs[0],
        "<h2>Per-step timeline</h2>", divs[1], divs[2],
        "<h2>Acceptance</h2>", divs[3], divs[4],
        token_diff_section(s, dd),
        "<h2>Trees of chosen steps</h2>" + "".join(divs[5:5 + num_trees]),
        ops_section(capture) if capture is not None else "",
    ])
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>DDTree Studio report</title>"
            f"<style>{CSS}</style></head><body>{body}</body></html>").encode()
