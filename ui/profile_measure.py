"""The Profile page's measurement: the repeats to take, the Measure button with an estimate of how long it takes, the
running measurement's progress (ui/profile_jobs.py), and the speed badges of a measurement."""
from __future__ import annotations

import streamlit as st

from engine.records import MODE_LABELS
from profiling.estimate import duration_text, measure_estimate_s
from profiling.measure import measure_job
from profiling.measurement import Measurement
from profiling.tau_text import summary_beside_tau
from ui import profile_jobs, state, views
from ui.current import request_of, target_model


def estimate_text(count: int) -> str:
    """How long `count` repeats take, at the pace of the measurement already taken of these settings."""
    kept = state.current().measurement
    if kept is None:
        return ("No estimate yet: nothing of these settings has been timed. Once it starts, the progress bar gives "
                "the time left, and Stop ends it.")
    return (f"About {duration_text(measure_estimate_s(kept.runs, count))} for {count} repeat(s), at the pace of the "
            f"last measurement (a busy machine takes longer).")


def controls() -> None:
    """Repeats and Measure (disabled with a recording open or while a job runs), the estimate, the progress."""
    shown = state.current()
    blocked = shown.needs_model() or profile_jobs.busy()
    repeats_col, button_col = st.columns([1, 4], vertical_alignment="bottom")
    count = int(repeats_col.number_input("Repeats", 1, 50, key="profile_repeats", disabled=bool(blocked),
                                         help="Decodes of AR and each mode after one warm-up; the numbers are "
                                              "medians."))
    label = "Measure" if shown.measurement is None else "Measure again"
    button_col.button(label, key="profile_measure", type="primary", disabled=bool(blocked), on_click=_start,
                      help=blocked or "Decode AR and the speculative runs `Repeats` times and measure them.")
    if shown.needs_model():
        st.caption(shown.needs_model())
    elif profile_jobs.running() is None:
        st.caption(estimate_text(count))
    profile_jobs.progress("measure")
    profile_jobs.note("measure")


def _start() -> None:
    """The button's callback: it runs before the page is drawn, which then shows the job running."""
    shown, count = state.current(), int(st.session_state["profile_repeats"])
    s = shown.settings
    profile_jobs.start("measure", measure_job(request_of(s), target_model(s), count), shown.keep)


def arrow(speedup: float | None) -> tuple[str, str]:
    """The badge's (arrow, colour): up and green above AR's speed, down and red below it."""
    if speedup is None or speedup == 1:
        return "off", "gray"
    return ("up", "green") if speedup > 1 else ("down", "red")


def badges(measurement: Measurement) -> None:
    """AR's tokens/s, then each mode's with its median speedup and tau."""
    measured, summaries = measurement.repeats.modes, measurement.summaries
    columns = st.columns(1 + len(summaries))
    columns[0].metric("AR tokens/s", views.number(measured["ar"]["tokens_per_s"]["median"], ".1f"),
                      help=views.spread_text(measured["ar"]["tokens_per_s"]))
    for col, (mode, summary) in zip(columns[1:], summaries.items(), strict=True):
        label, speedup = MODE_LABELS[mode], measured[mode]["speedup"]
        direction, colour = arrow(speedup["median"])
        col.metric(f"{label} tokens/s", views.number(measured[mode]["tokens_per_s"]["median"], ".1f"),
                   delta=f"{views.speedup(summary | {'speedup': speedup['median']})} speedup, tau "
                         f"{views.number(summary['tau'], '.2f')}", delta_color=colour, delta_arrow=direction,
                   help=f"tokens/s {views.spread_text(measured[mode]['tokens_per_s'])}; speedup "
                        f"{views.spread_text(speedup)}; tau {summary_beside_tau(summary)}")
