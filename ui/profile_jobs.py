"""The Profile page's one background measurement per tab (profiling/job.py): started by a button, drawn with its
progress, the time left and a Stop button while it runs, and its result handed to the decode it was started for.

Streamlit reruns the page on every click, so the work runs in its own thread and only its Job object lives in this
tab's st.session_state (KEY): a rerun redraws the progress, Stop sets the job's flag and the work ends at its next
decode step. A fragment polls the running job every POLL_S seconds and reruns the page once it has ended.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import streamlit as st

from profiling.estimate import duration_text
from profiling.job import Job
from ui import state
from ui.current import Current

KEY = "profile_job"  # the tab's Running, or None
NOTE = "profile_job_note"  # (kind, what the last job that did not finish left to say), or None
POLL_S = 1.0


@dataclass(slots=True)
class Running:
    kind: str  # "measure" or "sweep": which section of the page draws it
    job: Job
    owner: Current  # the decode it measures: its result is kept there, and dropped if the settings changed
    keep: Callable[[object], None]  # hands the result to the owner


def running() -> Running | None:
    return st.session_state.get(KEY)


def busy() -> str | None:
    """Why a control that decodes waits (None: nothing runs)."""
    r = running()
    return None if r is None else f"A {r.kind} is running: stop it or wait for it first."


def start(kind: str, job: Job, keep: Callable[[object], None]) -> None:
    """Start `job` for the tab's current decode; a second click while one runs (a stale button) does nothing."""
    if running() is not None:
        return
    st.session_state[NOTE] = None
    st.session_state[KEY] = Running(kind, job.start(), state.current(), keep)


def collect() -> None:
    """Before the page draws: a job whose decode is no longer the tab's current one is stopped; an ended job's
    result goes to its decode, or its stop or error becomes the note its section shows."""
    st.session_state.setdefault(KEY, None)
    st.session_state.setdefault(NOTE, None)
    r = running()
    if r is None:
        return
    if r.owner is not state.current():
        r.job.stop()
    if r.job.running:
        return
    st.session_state[KEY] = None
    job = r.job
    if r.owner is not state.current():
        note = "The settings changed while it ran: nothing was kept."
    elif job.error is not None:
        note = f"It failed: {type(job.error).__name__}: {job.error}"
    elif job.stopped:
        note = (f"Stopped after {duration_text(job.elapsed_s)}, {job.units} of {job.plan.units} {job.plan.unit}s "
                "done: nothing was kept (a partial measurement would mislead).")
    else:
        r.keep(job.result)
        note = None
    st.session_state[NOTE] = None if note is None else (r.kind, note)


def note(kind: str) -> None:
    """What the last `kind` job that did not finish left to say."""
    left = st.session_state.get(NOTE)
    if left is not None and left[0] == kind:
        st.warning(left[1])


def progress_text(job: Job) -> str:
    done = f"{job.units} of {job.plan.units} {job.plan.unit}s done, {duration_text(job.elapsed_s)} so far"
    if job.stopping:
        return f"Stopping at the next step... ({done})"
    left = job.left_s
    return done + (f", about {duration_text(left)} left" if left is not None else ": warming up, timing the pace")


def progress(kind: str) -> None:
    """The running `kind` job's progress bar and Stop button (nothing when none runs)."""
    r = running()
    if r is not None and r.kind == kind:
        _poll(kind)


@st.fragment(run_every=POLL_S)
def _poll(kind: str) -> None:
    r = running()
    if r is None or r.kind != kind:
        return
    if not r.job.running:
        st.rerun()  # the whole page: collect() hands the result over
    st.progress(r.job.fraction, text=progress_text(r.job))
    st.button("Stop", key=f"stop_{kind}", on_click=r.job.stop, disabled=r.job.stopping,
              help="End the measurement at its next decode step; nothing of it is kept")
