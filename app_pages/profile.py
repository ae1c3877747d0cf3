"""Profile: where a step's time goes, AR vs DDTree speed, acceptance, and the best budget for this model."""
import streamlit as st

from engine.records import MODE_LABELS
from profiling.charts import acceptance_figure, position_figure
from profiling.metrics import kernel_table, summarize_runs
from profiling.sweep import DEFAULT_BUDGETS, fastest, parse_budgets
from ui import charts, drafter_health, state, views

st.title("Profile")
if st.button("Re-run", icon="🔁", help="Decode AR and the speculative runs again and re-measure."):
    state.forget_runs()
runs = state.runs()
summaries = summarize_runs(runs)
first = next(iter(summaries.values()))
columns = st.columns(1 + len(summaries))
columns[0].metric("AR tokens/s", views.number(first["ar_tokens_per_s"], ".1f"))
for col, (mode, summary) in zip(columns[1:], summaries.items(), strict=True):
    label = MODE_LABELS[mode]
    col.metric(f"{label} tokens/s", views.number(summary["tokens_per_s"], ".1f"),
               delta=f"{views.speedup(summary)} speedup, tau {views.number(summary['tau'], '.2f')}",
               delta_color="off")
for summary in summaries.values():
    warning = views.divergence_warning(summary)
    if warning:
        st.warning(warning, icon="⚠️")

st.subheader("Per-kernel timings")
labels = {MODE_LABELS[m]: m for m in reversed(runs)}
run = runs[labels[st.radio("Run", list(labels), key="profile_run", horizontal=True)]]
table = [{"range": "\u2003" * r["depth"] + r["name"].removeprefix("step/"), **{k: r[k] for k in (
    "count", "total_ms", "mean_ms", "p50_ms", "p95_ms", "self_ms", "share")}} for r in kernel_table(run)]
st.dataframe(table, hide_index=True, width="stretch", height="content",
             column_config={**{k: st.column_config.NumberColumn(format="%.3f") for k in (
                 "total_ms", "mean_ms", "p50_ms", "p95_ms", "self_ms")},
                 "share": st.column_config.ProgressColumn(min_value=0.0, max_value=1.0, format="percent")})
st.plotly_chart(charts.kernel_bars(run), width="stretch")
index = st.selectbox("Timeline of step", range(run.num_steps), key="timeline_step")
st.plotly_chart(charts.step_timeline(run.steps[index]), width="stretch")

st.subheader("Acceptance")
for summary in summaries.values():
    hist_col, position_col = st.columns(2)
    hist_col.plotly_chart(acceptance_figure(summary), width="stretch")
    position_col.plotly_chart(position_figure(summary), width="stretch")
drafter_health.panel(state.settings())

st.subheader("Budget sweep")
st.caption("The same prompt decoded with DDTree at each budget B; the fastest B per generated token is starred. "
           "CLI: `python -m engine sweep`.")
budgets_col, repeats_col = st.columns([4, 1])
text = budgets_col.text_input("Budgets", ", ".join(map(str, DEFAULT_BUDGETS)), key="sweep_budgets")
repeats = repeats_col.number_input("Repeats", 1, 20, 3, key="sweep_repeats", help="Decodes per budget, fastest kept")
if st.button("Run sweep", icon="📈"):
    try:
        budgets = parse_budgets(text)
    except ValueError as exc:
        st.error(str(exc))
    else:
        bar = st.progress(0.0, text="Sweeping...")
        state.sweep(budgets, int(repeats),
                    lambda done, total: bar.progress(done / total, text=f"Budget {done}/{total}"))
        bar.empty()
rows = st.session_state.sweep
if rows:
    best = fastest(rows)
    st.markdown(f"Fastest: **B = {best['budget']}**, {best['ms_per_token']:.3f} ms per token, tau {best['tau']:.2f}.")
    st.dataframe(rows, hide_index=True, width="stretch", height="content")
    st.plotly_chart(charts.sweep(rows), width="stretch")
