"""Profile: where a step's time goes, AR vs DDTree speed, acceptance, and the best budget for this model. Nothing is
decoded until a button asks: a measurement and a sweep run in the background with their progress and a Stop button
(ui/profile_jobs.py)."""
import streamlit as st

from engine.records import MODE_LABELS
from profiling.charts import acceptance_figure, position_figure
from profiling.expert_chart import expert_figure, expert_rows
from profiling.metrics import kernel_table
from profiling.repeats import LARGE_SPREAD, relative_spread
from ui import (
    capture_panel,
    charts,
    drafter_health,
    profile_jobs,
    profile_measure,
    profile_sweep,
    recorded,
    source,
    stage_floor_panel,
    state,
    views,
)

st.title("Profile")
profile_jobs.collect()
stepped = source.pick("profile_source") == source.STEPPED
if stepped:
    measurement = source.stepped()
else:
    profile_measure.controls()
    measurement = state.current().measurement  # its runs: the median repeat
if measurement is None:
    st.info("Nothing measured yet: press **Measure** to decode AR and the speculative runs `Repeats` times.")
else:
    runs, summaries, statistics = measurement.runs, measurement.summaries, measurement.repeats
    measured = statistics.modes
    profile_measure.badges(measurement)
    st.caption(f"Medians of {statistics.count} repeat(s) (after one warm-up); the table gives each statistic's "
               "spread. TTFT: the prefill's time, which yields the first token; ITL: the time between token "
               "deliveries (a step delivers its committed tokens at once), p50 and p95 within each repeat.")
    for mode, row in measured.items():
        for key in row["large_spread"]:
            st.warning(f"Large spread: {MODE_LABELS[mode]} {views.STATISTICS[key]} varies by "
                       f"{relative_spread(row[key]):.0%} of its median between p10 and p90 (the rule: more than "
                       f"{LARGE_SPREAD:.0%}). Take more repeats or quiet the machine before trusting it.")
    st.dataframe(views.repeat_rows(measured), hide_index=True, width="stretch", height="content", key="repeat_stats",
                 column_config={k: st.column_config.NumberColumn(format="%.3f") for k in ("median", "p10", "p90",
                                                                                         "min", "max")})
    for summary in summaries.values():
        warning = views.divergence_warning(summary)
        if warning:
            st.warning(warning)

    st.plotly_chart(charts.runs_timeline(runs), width="stretch")

    st.subheader("Per-kernel timings")
    labels = {MODE_LABELS[m]: m for m in reversed(runs)}
    chosen = labels[st.radio("Run", list(labels), key="profile_run", horizontal=True)]
    run = runs[chosen]
    spread = statistics.ranges[chosen]
    table = [{"range": "\u2003" * r["depth"] + r["name"].removeprefix("step/"), **{k: r[k] for k in (
        "count", "total_ms", "mean_ms", "p50_ms", "p95_ms", "self_ms", "share")},
        "mean_ms median": spread[r["name"]]["median"], "mean_ms p10": spread[r["name"]]["p10"],
        "mean_ms p90": spread[r["name"]]["p90"]} for r in kernel_table(run)]
    st.caption(f"The {MODE_LABELS[chosen]} run "
               f"{'you stepped' if stepped and chosen != 'ar' else 'of the median repeat'}; the last three columns: "
               f"its ranges' mean ms over all {statistics.count} repeats (median, p10, p90).")
    st.dataframe(table, hide_index=True, width="stretch", height="content",
                 column_config={**{k: st.column_config.NumberColumn(format="%.3f") for k in (
                     "total_ms", "mean_ms", "p50_ms", "p95_ms", "self_ms", "mean_ms median", "mean_ms p10",
                     "mean_ms p90")},
                     "share": st.column_config.ProgressColumn(min_value=0.0, max_value=1.0, format="percent")})
    st.plotly_chart(charts.kernel_bars(run), width="stretch")
    index = st.selectbox("Timeline of step", range(run.num_steps), key="timeline_step")
    st.plotly_chart(charts.step_timeline(run.steps[index]), width="stretch")
    stage_floor_panel.section(run, MODE_LABELS[chosen], recorded.current() is not None)

capture_panel.section()

if measurement is not None:
    experts = expert_rows(runs)
    if experts:
        st.subheader("MoE experts touched")
        st.caption("Per MoE layer, the distinct routed experts each run's verify chose (mean per step): AR reads at "
                   "most top-k experts a layer, a tree of B + 1 nodes up to B + 1 times that. This, not attention, "
                   "is what a wider tree costs an MoE target.")
        st.plotly_chart(expert_figure(experts), width="stretch")
        st.dataframe([{"run": r["run"], "experts touched (all layers)": r["touched_total"],
                       "expert GB / step": r["gb_per_step"], "expert MB / token": r["mb_per_token"]}
                      for r in experts], hide_index=True, width="stretch", height="content")

    st.subheader("Acceptance")
    for mode, summary in summaries.items():
        hist_col, position_col, rank_col = st.columns(3)
        hist_col.plotly_chart(acceptance_figure(summary), width="stretch")
        position_col.plotly_chart(position_figure(summary), width="stretch")
        rank_col.plotly_chart(charts.rank_figure(runs[mode], MODE_LABELS[mode]), width="stretch")
drafter_health.panel(state.settings())

profile_sweep.section()
