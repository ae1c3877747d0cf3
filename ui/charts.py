"""Plotly figures only the dashboard draws: kernel time per step, one step's timeline, the budget sweep.

The tree, mask, acceptance and stage figures the reports share live in profiling.figures and profiling.charts."""
from __future__ import annotations

import re

import plotly.graph_objects as go
from plotly.colors import qualitative, sample_colorscale
from plotly.subplots import make_subplots

from engine.records import MODE_LABELS, BudgetChoice, RunRecord, StepRecord
from profiling.charts import MODE_COLORS, time_unit
from profiling.metrics import self_ns
from profiling.spans import nested, step_spans
from profiling.sweep import winner

_LAYER = re.compile(r"/layer\d+/")


def self_ms(step: StepRecord) -> dict[str, float]:
    """Each range's self time (profiling.metrics.self_ns) in ms, layers folded together (layer*): these add up
    to the step's total, so they stack into one bar per step."""
    out: dict[str, float] = {}
    for name, ns in self_ns(step.timings_ns).items():
        label = _LAYER.sub("/layer*/", name.removeprefix("step/")) if name != "step" else "step (between stages)"
        out[label] = out.get(label, 0.0) + max(ns, 0) / 1e6
    return out


def distinct_colours(n: int) -> list[str]:
    """n colours no two alike: Dark24's while they last, else n evenly spaced samples of the Turbo scale."""
    if n <= len(qualitative.Dark24):
        return list(qualitative.Dark24[:n])
    return sample_colorscale("Turbo", [i / (n - 1) for i in range(n)])


def kernel_bars(run: RunRecord) -> go.Figure:
    per_step = [self_ms(step) for step in run.steps]
    labels = list(dict.fromkeys(label for row in per_step for label in row))
    colours = distinct_colours(len(labels))
    fig = go.Figure([go.Bar(name=label, x=[s.index for s in run.steps], y=[row.get(label, 0.0) for row in per_step],
                            marker_color=colour, hovertemplate=f"{label}<br>step %{{x}}: %{{y:.3f}} ms<extra></extra>")
                     for label, colour in zip(labels, colours, strict=True)])
    fig.update_layout(barmode="stack", xaxis_title="step", yaxis_title="ms (self time)", height=420,
                      title="Time per step by range (self time, layers folded)",
                      legend={"font": {"size": 10}}, margin={"t": 50, "b": 40})
    return fig


def step_timeline(step: StepRecord) -> go.Figure:
    """The step's ranges as horizontal bars from their start offset (in µs, ms or s as the step's length needs),
    nested ranges one row each."""
    rows = nested(step_spans(step))
    unit, size = time_unit(max((span.start_ns + span.dur_ns for span, _ in rows), default=0))
    names = [span.name.removeprefix("step/") if span.name != "step" else "step" for span, _ in rows]
    fig = go.Figure(go.Bar(
        y=names, x=[span.dur_ns / size for span, _ in rows], base=[span.start_ns / size for span, _ in rows],
        orientation="h", marker={"color": [depth for _, depth in rows], "colorscale": "Viridis"},
        customdata=[[span.start_ns / size, depth] for span, depth in rows],
        hovertemplate=f"%{{y}}<br>start %{{customdata[0]:.4g}} {unit}, %{{x:.4g}} {unit}<extra></extra>"))
    fig.update_yaxes(autorange="reversed", tickfont={"size": 10}, automargin=True)  # range names shown whole
    fig.update_layout(xaxis_title=f"{unit} since the step started", height=max(300, 18 * len(rows) + 80),
                      margin={"t": 30, "b": 40})
    return fig


def sweep(rows: list[dict]) -> go.Figure:
    """tau and ms per token against the fixed budgets; an auto row (--budget auto:MAX) is a dashed level across
    both, so it reads against the whole curve."""
    fixed = [r for r in rows if not isinstance(r["budget"], str)]
    budgets = [r["budget"] for r in fixed]
    fig = make_subplots(1, 2, subplot_titles=("tau (tokens per step) vs B", "ms per generated token vs B"))
    fig.add_scatter(x=budgets, y=[r["tau"] for r in fixed], mode="lines+markers", row=1, col=1, showlegend=False)
    fig.add_scatter(x=budgets, y=[r["ms_per_token"] for r in fixed], mode="lines+markers", row=1, col=2,
                    showlegend=False, error_y={"type": "data", "symmetric": False,
                                               "array": [r["ms_p90"] - r["ms_per_token"] for r in fixed],
                                               "arrayminus": [r["ms_per_token"] - r["ms_p10"] for r in fixed]})
    for r in (r for r in rows if isinstance(r["budget"], str)):
        for col, key in ((1, "tau"), (2, "ms_per_token")):
            fig.add_hline(y=r[key], line_dash="dash", line_color="#2ca02c", row=1, col=col,
                          annotation_text=f"{r['budget']}: {r[key]:.3g}", annotation_position="top left")
    best = winner(rows)
    if best is not None and not isinstance(best["budget"], str):  # starred only when clear of every other's range
        fig.add_scatter(x=[best["budget"]], y=[best["ms_per_token"]], mode="markers", row=1, col=2, name="fastest",
                        marker={"size": 14, "symbol": "star", "color": "#d62728"})
    if budgets:
        fig.update_xaxes(type="log" if min(budgets) > 0 else "linear", tickvals=budgets, title_text="budget B")
    fig.update_layout(height=340, margin={"t": 40, "b": 40})
    return fig


def expected_acceptance(steps: list[StepRecord]) -> go.Figure:
    """Per step: the expected number of accepted drafted tokens under the target (NodeProbs.expected_accepted),
    the drafter's own surrogate of it (draft_expected) and the number actually accepted."""
    index = [s.index for s in steps if s.probs is not None]
    probs = [s.probs for s in steps if s.probs is not None]
    fig = go.Figure([
        go.Scatter(x=index, y=[p.expected_accepted for p in probs], mode="lines+markers", name="expected (target)"),
        go.Scatter(x=index, y=[p.draft_expected for p in probs], mode="lines+markers", name="drafter's surrogate",
                   line={"dash": "dot"}),
        go.Bar(x=index, y=[s.num_accepted for s in steps if s.probs is not None], name="accepted (realised)",
               marker={"color": "#c7c7c7"}, opacity=0.7)])
    fig.update_layout(xaxis_title="step", yaxis_title="drafted tokens accepted", height=320,
                      title="Acceptance per step: expected, the drafter's surrogate, realised",
                      legend={"orientation": "h", "y": -0.25}, margin={"t": 50, "b": 40})
    return fig


def accepted_ranks(run: RunRecord) -> list[int]:
    """How many accepted drafted tokens were the drafter's rank 0, 1, 2, ... candidate at their depth."""
    ranks = [step.tree.ranks[n] for step in run.steps for n in step.path[1:]]
    counts = [0] * (max(ranks) + 1 if ranks else 0)
    for r in ranks:
        counts[r] += 1
    return counts


def rank_figure(run: RunRecord, label: str) -> go.Figure:
    counts = accepted_ranks(run)
    total = sum(counts) or 1
    fig = go.Figure(go.Bar(x=list(range(len(counts))), y=counts, customdata=[c / total for c in counts],
                           hovertemplate="rank %{x}: %{y} accepted tokens (%{customdata:.1%})<extra></extra>"))
    fig.update_layout(title=f"{label}: accepted tokens by draft rank<br><sup>the drafter's rank at their depth</sup>",
                      height=300,
                      xaxis={"title": "draft rank (0: the drafter's top choice)", "dtick": 1},
                      yaxis_title="accepted tokens", margin={"t": 70, "b": 40})
    return fig


def runs_timeline(runs: dict[str, RunRecord]) -> go.Figure:
    """Every run on one time axis from its own start: the prefill, then each step as a bar as long as its wall
    time, so AR's many short steps and DDTree's few long ones compare directly."""
    fig = go.Figure()
    for mode, run in runs.items():
        starts, widths, names = [0.0], [run.prefill_ns / 1e6], ["prefill"]
        for step in run.steps:
            starts.append(starts[-1] + widths[-1])
            widths.append(step.wall_ns / 1e6)
            names.append(f"step {step.index}: {step.num_committed} tokens")
        fig.add_trace(go.Bar(y=[MODE_LABELS[mode]] * len(widths), x=widths, base=starts, orientation="h",
                             name=MODE_LABELS[mode], marker={"color": MODE_COLORS[mode], "line": {"width": 1,
                                                                                                 "color": "white"}},
                             customdata=names, hovertemplate="%{customdata}<br>%{base:.1f} ms + %{x:.2f} ms"
                                                             "<extra></extra>"))
    fig.update_layout(barmode="overlay", xaxis_title="ms since the run started (prefill, then each step)",
                      height=120 + 60 * len(runs), showlegend=False, margin={"t": 30, "b": 40},
                      title="The runs on one time axis")
    fig.update_yaxes(autorange="reversed", automargin=True)
    return fig


def budget_choice(choice: BudgetChoice) -> go.Figure:
    """One step's --budget auto decision over its buckets: the expected tokens the step commits (1 + expected
    accepted; the buckets past the tree's build limit greyed, they add no node), the predicted step time, and their
    ratio with the chosen budget marked."""
    x = [str(b) for b in choice.buckets]
    fig = make_subplots(1, 3, subplot_titles=(f"expected tokens (1 + accepted), built at {choice.built}",
                                              "predicted step ms", "expected tokens per second"))
    built = ["#1f77b4" if b <= choice.built else "#c7c7c7" for b in choice.buckets]
    fig.add_bar(x=x, y=[1 + e for e in choice.expected], marker_color=built, row=1, col=1, showlegend=False)
    fig.add_bar(x=x, y=[c * 1e3 for c in choice.cost_s], row=1, col=2, showlegend=False)
    colours = ["#d62728" if b == choice.chosen else "#1f77b4" for b in choice.buckets]
    fig.add_bar(x=x, y=choice.value, marker_color=colours, row=1, col=3, showlegend=False)
    fig.update_xaxes(title_text="budget b", type="category")
    fig.update_layout(height=300, margin={"t": 40, "b": 40})
    return fig


def budget_confidence(steps: list[StepRecord]) -> go.Figure:
    """The drafter's confidence correction per depth (realised over predicted acceptance) as the run learned it:
    one line per depth for the top-ranked token, over the steps."""
    chosen = [s for s in steps if s.budget is not None]
    fig = go.Figure()
    depths = len(chosen[-1].budget.confidence) if chosen else 0
    for d in range(1, depths):
        fig.add_scatter(x=[s.index for s in chosen], y=[s.budget.confidence[d][0] for s in chosen],
                        mode="lines", name=f"depth {d}")
    fig.add_hline(y=1.0, line_dash="dot", line_color="grey")
    fig.update_layout(height=300, margin={"t": 30, "b": 40}, xaxis_title="step",
                      yaxis_title="realised / predicted (top rank)")
    return fig

