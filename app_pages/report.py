"""Report: the export files of the current AR + DDTree pair, written by the same exporters as the CLI."""
import streamlit as st

from profiling.metrics import summarize
from profiling.report import render
from ui import state, views

FORMATS = {
    "report.html": ("text/html", "Self-contained report: summary, trees, timings (plotly inlined, opens offline)."),
    "report.json": ("application/json", "Versioned schema: every step record, the summary metrics, the environment."),
    "kernels.csv": ("text/csv", "Per-range timings: count, total, mean, p50, p95, share of the step."),
    "steps.csv": ("text/csv", "One row per step: accepted, committed, stage times."),
    "trace.json": ("application/json", "Chrome Trace Event format: open it in Perfetto (ui.perfetto.dev)."),
}

st.title("Report")
st.caption("Everything below comes from one AR run and one DDTree run of the sidebar's settings "
           "(the same pair the Profile and Compare pages show); `python -m engine run` writes the same files.")
ar, dd = state.pair()
if st.session_state.reports is None:  # rendered once per pair
    with st.spinner("Rendering the reports..."):
        st.session_state.reports = {name: render(ar, dd, name) for name in FORMATS}
files = st.session_state.reports
summary = summarize(ar, dd)
exact, sentence = views.verdict(summary)
st.markdown(f"{sentence} tau {views.number(summary['tau'], '.2f')} tokens per DDTree step, "
            f"speedup {views.number(summary['speedup'], '.2f', 'x')} over AR.")
for name, (mime, what) in FORMATS.items():
    button_col, text_col = st.columns([1, 4], vertical_alignment="center")
    button_col.download_button(name, files[name], file_name=name, mime=mime, on_click="ignore",
                               icon=":material/download:", width="stretch", key=f"download_{name}")
    text_col.markdown(f"{what} · {len(files[name]):,} bytes")
