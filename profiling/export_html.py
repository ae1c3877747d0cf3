"""report.html: one self-contained page (plotly.js inlined, inline CSS, no external references) that reads
offline. It opens on what a reader wants (profiling/html_summary.py: the verdicts and headline numbers, the prompt
and the generated texts, acceptance and timing), then the kernel breakdown, per-step timelines, the token diff and
chosen steps' trees, with the full configuration folded away at the end."""
from __future__ import annotations

from engine.records import MODE_LABELS, RunRecord, StepRecord
from profiling.capture_data import Capture
from profiling.charts import acceptance_figure, figure_div, position_figure, stage_figure, timeline_figure
from profiling.figures import tree_figure
from profiling.html_parts import CSS, e, fmt, name_cell, table
from profiling.html_summary import config_details, headline_section, settings_line, text_section, timing_table
from profiling.measurement import Measurement
from profiling.metrics import kernel_table, num_dropped, primary_mode
from profiling.token_diff import diff_html, label_of, vocabulary_piece

MAX_TREES = 4
MAX_OPS = 25


def kernel_section(rows: list[dict], capture: Capture | None) -> str:
    on_device = capture is not None and "cuda" in capture.activities
    header = ["mode", "range", "count", "total ms", "mean ms", "p50 ms", "p95 ms", "self ms", "share"]
    header += (["profiler host ms"] if capture is not None else []) + (["device ms"] if on_device else [])
    body = []
    for r in rows:
        name = "  " * r["depth"] + r["name"][len(r["parent"]) + 1:] if r["parent"] else r["name"]
        cells = [r["mode"], None, r["count"], r["total_ms"], r["mean_ms"], r["p50_ms"], r["p95_ms"], r["self_ms"]]
        row = [f"<td>{fmt(c)}</td>" for c in cells]
        row[1] = name_cell(name, title=r["name"])
        row.append(f"<td>{r['share']:.1%}</td>" if r["share"] is not None else "<td>–</td>")
        if capture is not None:
            row.append(f"<td>{fmt(r['profiler_cpu_ms'])}</td>")
        if on_device:
            row.append(f"<td>{fmt(r['device_ms'])}</td>")
        body.append(row)
    return ("<h2>Kernel breakdown</h2><p class='note'>One row per timed range, indented under its parent; share = "
            "the range's total / the total step time (nested rows add up within their parent). Hover a name for "
            "its full range.</p>" + table(header, body))


def token_diff_section(runs: dict[str, RunRecord], summaries: dict[str, dict], piece) -> str:
    """Each run's tokens as a strip (pieces where the model has a tokenizer, ids on hover), differences from AR in
    red, and where each speculative run first diverged."""
    notes = []
    for mode, s in summaries.items():
        div, label = s["first_divergence"], MODE_LABELS[mode]
        notes.append(f"{label}: no divergence" if div is None else
                     f"{label}: first divergence at position {div['position']} ({label} step {fmt(div['step'])}): "
                     f"AR token {_token(div['ar_token'], piece)}, {label} token {_token(div['token'], piece)}; AR "
                     f"top-1 minus top-2 logit there: {fmt(div['logit_gap'], 4)}, the {label} token below the AR "
                     f"top-1 by {fmt(div['token_gap'], 4)}")
    return (f"<h2>Token diff</h2>{''.join(f'<p>{e(t)}</p>' for t in notes)}<p class='note'>Every generated token, "
            "position by position; red: a token that differs from AR's at that position. Hover a token for its "
            f"position and id.</p>{diff_html(runs, piece)}")


def _token(token: int | None, piece) -> str:
    if token is None:
        return "–"
    return str(token) if piece is None else f"{token} {label_of(token, piece)!r}"


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
            row = [name_cell(o.range), name_cell(o.name),
                   f"<td>{o.count}</td>", f"<td>{fmt(o.cpu_ms)}</td>"]
            rows.append(row + ([f"<td>{fmt(o.device_ms)}</td>"] if on_device else []))
        header = ["range", "op", "calls", "host ms"] + (["device ms"] if on_device else [])
        parts.append(f"<h3>{e(mode)}</h3>" + table(header, rows))
    return (f"<h2>torch.profiler capture ({e(', '.join(capture.activities))})</h2><p class='note'>Top-level ops "
            "called directly inside each range, by time; timer numbers of a captured run include the profiler's "
            "overhead.</p>" + "".join(parts))


def render(data: Measurement) -> bytes:
    runs, capture, summaries = data.runs, data.capture, data.summaries
    primary = primary_mode(runs)
    spec = runs[primary]
    piece = vocabulary_piece(runs)
    rows = [row for run in runs.values() for row in kernel_table(run, capture)]
    figures = [stage_figure(rows), *(timeline_figure(run) for run in runs.values())]
    for summary in summaries.values():
        figures += [acceptance_figure(summary), position_figure(summary)]
    limit = int(spec.decode["max_new_tokens"])
    trees = [tree_figure(step, piece, num_dropped(spec.steps, step.index, limit))
             for step in chosen_steps(spec, summaries[primary])]
    divs = [figure_div(f, include_plotlyjs=(i == 0)) for i, f in enumerate(figures + trees)]
    num_timelines = len(runs)
    timelines, acceptance = divs[1:1 + num_timelines], divs[1 + num_timelines:len(figures)]
    body = "".join([
        f"<h1>DDTree Studio report</h1><p class='lead'>{e(settings_line(data))}</p>",
        headline_section(data),
        text_section(runs),
        "<h2>Acceptance and timing</h2>", timing_table(data), *acceptance,
        kernel_section(rows, capture), divs[0],
        "<h2>Per-step timeline</h2>", *timelines,
        token_diff_section(runs, summaries, piece),
        f"<h2>Trees of chosen {MODE_LABELS[primary]} steps</h2>" + "".join(divs[len(figures):]),
        ops_section(capture) if capture is not None else "",
        config_details(data),
    ])
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>DDTree Studio report</title>"
            f"<style>{CSS}</style></head><body>{body}</body></html>").encode()
