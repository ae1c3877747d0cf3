"""Plotly charts of a whole decode: per-step timeline, stage breakdown, acceptance. Used by report.html and
the dashboard's profile page."""
from __future__ import annotations

import plotly.graph_objects as go
import plotly.io as pio

from engine.records import MODE_LABELS, MODES, RunRecord
from engine.timers import stage_category
from profiling.spans import PREFILL, run_spans

STAGE_COLORS = {"prefill": "#1f77b4", "step": "#ff7f0e", "draft": "#17becf", "tree_build": "#d62728",
                "verify": "#9467bd", "tree_accept": "#8c564b", "kv_compact": "#e377c2", "commit": "#7f7f7f",
                "draft_update": "#2ca02c"}
OTHER_COLORS = ("#bcbd22", "#2ca02c", "#aec7e8", "#ffbb78")
MODE_COLORS = {"ar": "#7f7f7f", "chain": "#ff7f0e", "ddtree": "#1f77b4"}  # one colour per run in every chart


def stage_color(category: str) -> str:
    """One colour per stage in every chart (stages outside the known ones share a small palette)."""
    return STAGE_COLORS.get(category, OTHER_COLORS[sum(map(ord, category)) % len(OTHER_COLORS)])


def time_unit(span_ns: float) -> tuple[str, float]:
    """The unit an axis spanning `span_ns` reads best in, and its size in ns: µs below 2 ms, ms below 2 s, else s
    (no axis of µs in millions)."""
    if span_ns < 2e6:
        return "µs", 1e3
    return ("ms", 1e6) if span_ns < 2e9 else ("s", 1e9)


def timeline_figure(run: RunRecord) -> go.Figure:
    """Every timed range as a horizontal bar at its start (base) on the run's timeline, one row per nesting
    depth, coloured by stage."""
    spans = run_spans(run)
    unit, size = time_unit(max((s.start_ns + s.dur_ns for s in spans), default=0))
    by_category: dict[str, list] = {}
    for s in spans:
        by_category.setdefault(PREFILL if s.step is None else stage_category(s.name), []).append(s)
    fig = go.Figure()
    for category, group in by_category.items():
        fig.add_trace(go.Bar(
            orientation="h", name=category, marker_color=stage_color(category),
            base=[s.start_ns / size for s in group], x=[s.dur_ns / size for s in group],
            y=[f"depth {s.depth}" for s in group],
            customdata=[[s.name, "prefill" if s.step is None else s.step, s.start_ns / size] for s in group],
            hovertemplate=f"%{{customdata[0]}}<br>step %{{customdata[1]}}<br>start %{{customdata[2]:.3f}} {unit}, "
                          f"%{{x:.3f}} {unit}<extra></extra>"))
    depths = sorted({s.depth for s in spans})
    fig.update_layout(barmode="overlay", title=f"{run.mode} timeline ({run.num_steps} steps after the prefill)",
                      xaxis={"title": f"{unit} since the prefill started"},
                      yaxis={"categoryorder": "array", "categoryarray": [f"depth {d}" for d in reversed(depths)]},
                      height=160 + 40 * len(depths), margin={"l": 70, "r": 20, "t": 50, "b": 40})
    return fig


def stage_figure(rows: list[dict], depth: int = 1) -> go.Figure:
    """Mean ms per step of each range at `depth` (1: the stages), the runs side by side (kernel_table rows)."""
    fig = go.Figure()
    modes = [m for m in MODES if any(r["mode"] == m for r in rows)]
    order = list(dict.fromkeys(r["name"] for mode in reversed(modes) for r in rows
                               if r["mode"] == mode and r["depth"] == depth))
    for mode in modes:
        picked = [r for r in rows if r["mode"] == mode and r["depth"] == depth]
        fig.add_trace(go.Bar(name=MODE_LABELS[mode], marker_color=MODE_COLORS[mode], x=[r["name"] for r in picked],
                             y=[r["mean_ms"] for r in picked],
                             customdata=[[r["share"] or 0.0] for r in picked],
                             hovertemplate="%{x}: %{y:.3f} ms/step, %{customdata[0]:.1%} of the step<extra></extra>"))
    fig.update_layout(barmode="group", title="mean time per step by stage", yaxis={"title": "ms per step"},
                      xaxis={"categoryorder": "array", "categoryarray": order},
                      height=380, margin={"l": 60, "r": 20, "t": 50, "b": 80})
    return fig


def acceptance_figure(summary: dict) -> go.Figure:
    """Steps per number of accepted drafted tokens."""
    hist = summary["acceptance_histogram"]
    fig = go.Figure(go.Bar(x=list(range(len(hist))), y=hist, marker_color=MODE_COLORS[summary["mode"]],
                           hovertemplate="%{y} steps accepted %{x} drafted tokens<extra></extra>"))
    label = MODE_LABELS[summary["mode"]]
    tau = "" if summary["tau"] is None else f"<br><sup>tau = {summary['tau']:.2f} tokens/step, bonus included</sup>"
    fig.update_layout(title=f"{label}: acceptance lengths{tau}",
                      xaxis={"title": "drafted tokens accepted in a step", "dtick": 1}, yaxis={"title": "steps"},
                      height=340, margin={"l": 60, "r": 20, "t": 70, "b": 50})
    return fig


def position_figure(summary: dict) -> go.Figure:
    """Fraction of steps whose accepted path reached each depth."""
    rates = summary["per_position_acceptance"]
    fig = go.Figure(go.Bar(x=list(range(1, len(rates) + 1)), y=rates, marker_color=MODE_COLORS[summary["mode"]],
                           hovertemplate="depth %{x}: %{y:.1%} of steps<extra></extra>"))
    fig.update_layout(title=f"{MODE_LABELS[summary['mode']]}: per-position acceptance",
                      xaxis={"title": "depth", "dtick": 1},
                      yaxis={"title": "fraction of steps", "range": [0, 1], "tickformat": ".0%"},
                      height=340, margin={"l": 60, "r": 20, "t": 50, "b": 50})
    return fig


def figure_div(fig: go.Figure, include_plotlyjs: bool) -> str:
    """An HTML fragment of the figure; include_plotlyjs inlines plotly.js itself (once per page)."""
    return pio.to_html(fig, include_plotlyjs=include_plotlyjs, full_html=False,
                       config={"displaylogo": False, "responsive": True})
