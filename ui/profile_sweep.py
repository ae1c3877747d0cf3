"""The Profile page's budget sweep: the budgets and repeats (a quick default), Run sweep with an estimate, the running
sweep's progress and Stop (ui/profile_jobs.py), then its verdict, table and chart."""
from __future__ import annotations

import streamlit as st

from profiling.estimate import duration_text, sweep_estimate_s
from profiling.sweep import QUICK_BUDGETS, QUICK_REPEATS, parse_budgets, sweep_job, verdict
from ui import charts, profile_jobs, state
from ui.current import request_of, target_model
from ui.safe_text import plain


def estimate_text(budgets: list[int | str], repeats: int) -> str:
    kept = state.current().measurement
    decodes = 1 + len(budgets) * repeats
    if kept is None:
        return f"{decodes} DDTree decodes (one untimed first); no estimate yet: nothing of these settings was timed."
    return (f"{decodes} DDTree decodes (one untimed first): about "
            f"{duration_text(sweep_estimate_s(kept.runs, len(budgets), repeats))} at the pace of the last "
            "measurement (larger budgets take longer).")


def _start() -> None:
    """The button's callback: it runs before the page is drawn, which then shows the sweep running."""
    shown, ss = state.current(), st.session_state
    s = shown.settings
    try:
        budgets = parse_budgets(ss["sweep_budgets"])
    except ValueError:
        return  # the page shows the error under the budgets
    job = sweep_job(request_of(s), target_model(s), budgets, int(ss["sweep_repeats"]))
    profile_jobs.start("sweep", job, lambda rows: setattr(shown, "sweep", rows))


def section() -> None:
    st.subheader("Budget sweep")
    st.caption("The same prompt decoded with DDTree at each budget B, N times: the median ms per generated token with "
               "its p10-p90 range; a budget is starred as the fastest only when its range lies below every other "
               "budget's. The default is a quick sweep: type more budgets (up to 1024, and auto:MAX) or repeats for a "
               "finer one. CLI: `python -m engine sweep`.")
    shown = state.current()
    blocked = shown.needs_model() or profile_jobs.busy()
    budgets_col, repeats_col = st.columns([4, 1])
    text = budgets_col.text_input("Budgets", ", ".join(map(str, QUICK_BUDGETS)), key="sweep_budgets")
    repeats = int(repeats_col.number_input("Repeats", 1, 20, QUICK_REPEATS, key="sweep_repeats",
                                           help="Decodes per budget: the median and its p10-p90 range"))
    try:
        budgets = parse_budgets(text)
    except ValueError as exc:
        budgets = None
        st.error(plain(str(exc)))
    st.button("Run sweep", disabled=bool(blocked) or budgets is None, help=blocked, on_click=_start)
    if budgets is not None and not shown.needs_model() and profile_jobs.running() is None:
        st.caption(estimate_text(budgets, repeats))
    profile_jobs.progress("sweep")
    profile_jobs.note("sweep")
    rows = shown.sweep
    if rows:
        sentence = verdict(rows)
        st.markdown(sentence[0].upper() + sentence[1:] + ".")
        st.dataframe(rows, hide_index=True, width="stretch", height="content")
        st.plotly_chart(charts.sweep(rows), width="stretch")
