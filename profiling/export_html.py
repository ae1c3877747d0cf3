"""report.html: one self-contained page (plotly.js inlined, inline CSS, no external references) that reads
offline: summary, kernel breakdown, per-step timelines, acceptance, token diff and chosen steps' trees."""
from __future__ import annotations

import html

from engine.records import MODE_LABELS, RunRecord, StepRecord
from profiling.capture_data import Capture
from profiling.charts import acceptance_figure, figure_div, position_figure, stage_figure, timeline_figure
from profiling.divergence import verdict
from profiling.figures import tree_figure
from profiling.measurement import Measurement
from profiling.metrics import kernel_table, primary_mode

MAX_TREES = 4
DIFF = ' class="diff"'
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


def summary_section(summaries: dict[str, dict], env: dict, runs: dict[str, RunRecord]) -> str:
    ar = runs["ar"]
    verdicts = "".join(
        f'<p><span class="ok">{s["exactness"]}: {MODE_LABELS[m]} emitted exactly the AR tokens</span></p>'
        if s["matches_ar"] else f'<p><span class="bad">Warning: the texts differ. {_e(verdict(s, MODE_LABELS[m]))} '
        'Its speedup is measured over different outputs.</span></p>' for m, s in summaries.items())
    header = ["metric", "AR", *(MODE_LABELS[m] for m in summaries)]
    first = next(iter(summaries.values()))

    def row(name: str, ar_value: object, key: str | None) -> list[str]:
        values = [s[key] if key else None for s in summaries.values()]
        return [f'<td class="name">{_e(name)}</td>', f"<td>{_fmt(ar_value)}</td>", *(f"<td>{_fmt(v)}</td>"
                                                                                     for v in values)]

    rows = [row("generated tokens", len(ar.tokens), "num_generated"), row("steps", ar.num_steps, "num_steps"),
            row("nodes verified per step", 1, None), row("tau (tokens/step, bonus incl.)", 1.0, "tau"),
            row("tokens/s", first["ar_tokens_per_s"], "tokens_per_s"),
            row("speedup" + ("" if all(s["matches_ar"] for s in summaries.values()) else
                             " (* over different outputs)"), None, "speedup"),
            row("prefill ms", first["ar_prefill_ms"], "prefill_ms"), row("time ms", first["ar_time_ms"], "time_ms")]
    rows[2] = rows[2][:2] + [f"<td>{_fmt(runs[m].steps[0].tree.num_nodes if runs[m].steps else None)}</td>"
                             for m in summaries]
    settings = [("drafter", runs[next(iter(summaries))].drafter), ("block size", first["block_size"]),
                ("prompt", ar.prompt)]
    env_line = ", ".join(f"{k}: {v}" for k, v in env.items())
    return (f"<h2>Summary</h2>{verdicts}{_table(header, rows)}"
            + _table(["setting", "value"], [[f'<td class="name">{_e(k)}</td>', f"<td>{_e(v)}</td>"]
                                            for k, v in settings])
            + "<p class='note'>tokens/s = generated tokens (the prefill's included) / host wall time of the prefill "
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


def token_diff_section(summaries: dict[str, dict]) -> str:
    ar_tokens = next(iter(summaries.values()))["ar_tokens"]
    n = max(len(ar_tokens), *(len(s["tokens"]) for s in summaries.values()))
    cells: dict[str, list[str]] = {"position": [f"<td>{i}</td>" for i in range(n)],
                                   "AR": [f"<td>{_e(ar_tokens[i]) if i < len(ar_tokens) else ''}</td>"
                                          for i in range(n)]}
    notes = []
    for mode, s in summaries.items():
        tokens = s["tokens"]
        same = [i < len(tokens) and i < len(ar_tokens) and tokens[i] == ar_tokens[i] for i in range(n)]
        cells[MODE_LABELS[mode]] = [f"<td{'' if same[i] else DIFF}>{_e(tokens[i]) if i < len(tokens) else ''}</td>"
                                    for i in range(n)]
        div = s["first_divergence"]
        label = MODE_LABELS[mode]
        notes.append(f"{label}: no divergence" if div is None else
                     f"{label}: first divergence at position {div['position']} ({label} step {_fmt(div['step'])}): "
                     f"AR token {_fmt(div['ar_token'])}, {label} token {_fmt(div['token'])}; AR top-1 minus top-2 "
                     f"logit there: {_fmt(div['logit_gap'], 4)}, the {label} token below the AR top-1 by "
                     f"{_fmt(div['token_gap'], 4)}")
    rows = "".join(f"<tr><th>{k}</th>{''.join(v)}</tr>" for k, v in cells.items())
    return f"<h2>Token diff</h2>{''.join(f'<p>{_e(t)}</p>' for t in notes)}<table class='tokens'>{rows}</table>"


def chosen_steps(run: RunRecord, summary: dict) -> list[StepRecord]:
    """The first step, the longest and the shortest acceptance, and the step where the run diverged."""
    if not run.steps:
        return []
    picks = [run.steps[0], max(run.steps, key=lambda s: s.num_accepted),
             min(run.steps, key=lambda s: s.num_accepted)]
    div = summary["first_divergence"]
    if div is not None and div["step"] is not None:
        picks.append(run.steps[div["step"]])
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


def render(data: Measurement) -> bytes:
    runs, capture, summaries = data.runs, data.capture, data.summaries
    primary = primary_mode(runs)
    spec = runs[primary]
    env = data.environment
    rows = [row for run in runs.values() for row in kernel_table(run, capture)]
    figures = [stage_figure(rows), *(timeline_figure(run) for run in runs.values())]
    for summary in summaries.values():
        figures += [acceptance_figure(summary), position_figure(summary)]
    trees = [tree_figure(step) for step in chosen_steps(spec, summaries[primary])]
    divs = [figure_div(f, include_plotlyjs=(i == 0)) for i, f in enumerate(figures + trees)]
    num_timelines = len(runs)
    timelines, acceptance = divs[1:1 + num_timelines], divs[1 + num_timelines:len(figures)]
    body = "".join([
        "<h1>DDTree Studio report</h1>",
        _table(["model", "value"], [[f'<td class="name">{_e(k)}</td>', f"<td>{_e(v)}</td>"]
                                    for k, v in {**spec.model, **spec.decode}.items()]),
        summary_section(summaries, env, runs),
        kernel_section(rows, capture), divs[0],
        "<h2>Per-step timeline</h2>", *timelines,
        "<h2>Acceptance</h2>", *acceptance,
        token_diff_section(summaries),
        f"<h2>Trees of chosen {MODE_LABELS[primary]} steps</h2>" + "".join(divs[len(figures):]),
        ops_section(capture) if capture is not None else "",
    ])
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>DDTree Studio report</title>"
            f"<style>{CSS}</style></head><body>{body}</body></html>").encode()
