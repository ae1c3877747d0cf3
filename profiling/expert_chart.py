"""What a tree costs an MoE target, as a chart: the distinct routed experts each run's verify touched per MoE
layer (mean per step), AR beside the chain and DDTree, with the expert bytes a step reads and what those bytes
come to per committed token (profiling.metrics.expert_traffic). Used by the dashboard's Profile page."""
from __future__ import annotations

import plotly.graph_objects as go

from engine.records import MODE_LABELS, RunRecord
from profiling.charts import MODE_COLORS
from profiling.metrics import expert_traffic


def expert_rows(runs: dict[str, RunRecord]) -> list[dict]:
    """One row per run that has MoE layers: its label, experts touched per MoE layer and in all, GB per step and
    MB per committed token, and the MoE layers' names. Empty without MoE layers."""
    rows = []
    for mode, run in runs.items():
        traffic = expert_traffic(run)
        if traffic is not None:
            rows.append({"run": MODE_LABELS[mode], "mode": mode, "layers": moe_layer_names(run),
                         "touched": traffic["touched"],
                         "touched_total": traffic["touched_total"], "gb_per_step": traffic["bytes_read"] / 1e9,
                         "mb_per_token": traffic["bytes_per_token"] / 1e6})
    return rows


def moe_layer_names(run: RunRecord) -> list[str]:
    """The run's MoE layers as the timing ranges name them (layer{i}, i the model's layer index: the dense layers
    come first, first_k_dense_replace of them)."""
    first, count = run.model["first_k_dense_replace"], run.model["num_hidden_layers"]
    return [f"layer{i}" for i in range(first, count)]


def expert_figure(rows: list[dict]) -> go.Figure:
    """Grouped bars: experts touched per MoE layer, one colour per run."""
    fig = go.Figure()
    for row in rows:
        fig.add_trace(go.Bar(name=row["run"], marker_color=MODE_COLORS[row["mode"]],
                             x=row["layers"], y=row["touched"],
                             hovertemplate="%{x}: %{y:.1f} experts touched per step<extra>" + row["run"] +
                                           "</extra>"))
    fig.update_layout(barmode="group", height=300, margin={"l": 40, "r": 10, "t": 30, "b": 30},
                      xaxis_title="MoE layer", yaxis_title="distinct routed experts per step",
                      title="experts the verify touched")
    return fig
