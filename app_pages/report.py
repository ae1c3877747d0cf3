"""Report: the export files of the current runs (AR, then chain and/or DDTree), written by the CLI's exporters."""
import streamlit as st

from engine.records import MODE_LABELS
from ui import recorded, state, views

FORMATS = {
    "report.html": ("text/html", "Self-contained report: summary, trees, timings (plotly inlined, opens offline)."),
    "report.json": ("application/json", "Versioned schema: every step record, the summary metrics, the environment."),
    "kernels.csv": ("text/csv", "Per-range timings: count, total, mean, p50, p95, share of the step."),
    "steps.csv": ("text/csv", "One row per step: accepted, committed, stage times."),
    "trace.json": ("application/json", "Chrome Trace Event format: open it in Perfetto (ui.perfetto.dev)."),
}

st.title("Report")
st.caption("Everything below comes from the recording's runs, its repeat statistics, capture and environment kept "
           "as recorded." if recorded.current() is not None else "Everything below comes from the runs of the "
           "sidebar's settings (the same runs the Profile and Compare pages show, with the Profile page's repeat "
           "statistics); `python -m engine run` writes the same files.")
measurement = state.measured()
with st.spinner("Rendering the reports..."):
    files = state.reports(list(FORMATS))  # rendered once per measurement
for summary in measurement.summaries.values():
    exact, sentence = views.verdict(summary)
    warning = views.divergence_warning(summary)
    if warning:
        st.warning(warning)
    st.markdown(f"{sentence} tau {views.number(summary['tau'], '.2f')} tokens per {MODE_LABELS[summary['mode']]} "
                f"step, speedup {views.speedup(summary)} over AR.")
for name, (mime, what) in FORMATS.items():
    button_col, text_col = st.columns([1, 4], vertical_alignment="center")
    button_col.download_button(name, files[name], file_name=name, mime=mime, on_click="ignore", width="stretch",
                               key=f"download_{name}")
    text_col.markdown(f"{what} · {len(files[name]):,} bytes")
