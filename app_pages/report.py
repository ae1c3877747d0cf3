"""Report: the export files of the current runs (AR, then chain and/or DDTree), written by the CLI's exporters."""
import streamlit as st

from engine.records import MODE_LABELS
from profiling.tau_text import summary_beside_tau
from ui import recorded, state, views

FORMATS = {
    "report.html": ("text/html", "Self-contained report: summary, trees, timings (plotly inlined, opens offline)."),
    "report.json": ("application/json", "Versioned schema: every step record, the summary metrics, the environment."),
    "kernels.csv": ("text/csv", "Per-range timings: count, total, mean, p50, p95, share of the step."),
    "steps.csv": ("text/csv", "One row per step: accepted, committed, stage times."),
    "trace.json": ("application/json", "Chrome Trace Event format: open it in Perfetto (ui.perfetto.dev)."),
}

st.title("Report")
measurement = state.measured()
count = measurement.repeats.count
if recorded.current() is not None:
    st.caption(f"Everything below comes from the recording's runs, the statistics of its {count} repeat(s), its "
               "capture and environment, kept as recorded.")
else:
    names = " and ".join(MODE_LABELS[m] for m in measurement.runs if m != "ar")
    spread = ("one decode each, so no spread: measure more repeats on the Profile page and these files carry their "
              "medians and spread" if count == 1 else "medians with their spread; the runs are the median repeat's")
    st.caption(f"Everything below comes from the runs of the sidebar's settings measured in this tab: {count} "
               f"repeat(s) of AR and {names} after one warm-up ({spread}). `python -m engine run` writes the same "
               "files.")
with st.spinner("Rendering the reports..."):
    files = state.reports(list(FORMATS))  # rendered once per measurement
for summary in measurement.summaries.values():
    exact, sentence = views.verdict(summary)
    warning = views.divergence_warning(summary)
    if warning:
        st.warning(warning)
    st.markdown(f"{sentence} tau {views.number(summary['tau'], '.2f')} tokens per {MODE_LABELS[summary['mode']]} "
                f"step, {summary_beside_tau(summary)}; speedup {views.speedup(summary)} over AR.")
for name, (mime, what) in FORMATS.items():
    button_col, text_col = st.columns([1, 4], vertical_alignment="center")
    button_col.download_button(name, files[name], file_name=name, mime=mime, on_click="ignore", width="stretch",
                               key=f"download_{name}")
    text_col.markdown(f"{what} · {len(files[name]):,} bytes")
