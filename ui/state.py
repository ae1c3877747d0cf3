"""Per-tab state in st.session_state and the actions that change it.

Each browser tab has its own session_state, so two tabs never share a decoder. Keys (set up once by init()):
  live      ui.current.Live: the sidebar's settings and what was made of them (the stepped decoder, the Measurement,
            its exports, a capture, a sweep); replaced whole when the settings change (None while the sidebar holds
            an invalid prompt)
  recording ui.recorded.Opened: a report.json opened in place of the live decode (None: none), kept beside it
  uploads   uploaded or path-loaded checkpoints that loaded, by display name
  model_ids their identities (ui.settings.model_id), by display name
Every page reads current(): the open recording, else the live decode; both answer the same calls.
"""
from __future__ import annotations

import traceback
from collections.abc import Callable

import streamlit as st

from engine.records import MODE_LABELS, StepRecord
from kernels import ExtensionBuildError
from profiling import metrics
from profiling.measurement import Measurement
from profiling.report import render
from profiling.sweep import budget_sweep
from profiling.tau_text import beside_tau
from ui import recorded
from ui.current import Current, Live, request_of, target_model
from ui.safe_text import plain
from ui.settings import Settings
from ui.settings_change import changes


def init() -> None:
    ss = st.session_state
    ss.setdefault("live", None)
    ss.setdefault("uploads", {})
    ss.setdefault("model_ids", {})
    ss.setdefault("upload_error", None)
    recorded.init()


def current() -> Current | None:
    """The decode every page shows: the open recording, else the live one (None: neither)."""
    return recorded.current() or st.session_state.live


def settings() -> Settings | None:
    """The settings every page shows: the open recording's, else the sidebar's."""
    shown = current()
    return shown.settings if shown is not None else None


def tokenizer():
    """What turns the shown tokens into text: the model's tokenizer, a recording's vocabulary (None: neither)."""
    return current().tokenizer()


def needs_model() -> str | None:
    """None live; with a recording open, why a control that decodes is disabled."""
    return current().needs_model()


def apply(new: Settings | None) -> str | None:
    """Adopt the sidebar's settings; when they differ from the current ones, drop every decode made with the
    old ones and return a message naming what changed."""
    ss = st.session_state
    old = ss.live.settings if ss.live is not None else None
    if new == old:
        return None
    ss.live = Live(new) if new is not None else None
    if old is None or new is None:
        return None
    return f"Settings changed ({'; '.join(changes(old, new))}): the decode was reset."


def _engine(call: Callable, *args, **kwargs):
    """Run an engine call; any error it raises (bad input, no room in the cache, a failed kernel build, a bug)
    is shown as a message with its traceback in an expander, and stops this page; the app stays usable."""
    try:
        return call(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - every engine error becomes a message, never a raw exception
        show_error(exc)
        st.stop()


def show_error(exc: Exception) -> None:
    """An engine error as the dashboard shows it: the message, then the traceback on request."""
    expected = isinstance(exc, (ValueError, ExtensionBuildError))
    st.error(plain(f"{type(exc).__name__}: {exc}") + ("" if expected else " (an unexpected error: the traceback below "
                                                                    "says where)"))
    with st.expander("Traceback"):
        st.code("".join(traceback.format_exception(exc)), language=None)


def reset() -> None:
    current().reset()


def steps() -> list[StepRecord]:
    decoder = current().decoder
    return [] if decoder is None else decoder.steps


def done() -> bool:
    decoder = current().decoder
    return decoder is not None and decoder.done


FAILED = "decode_failure"  # an engine error a button's callback met: the page's run that follows shows it


def _run_steps(num_steps: int | None, on_step: Callable[[StepRecord], None] | None) -> int:
    shown = current()
    if shown.decoder is None:
        shown.decoder = shown.start()
    decoder = shown.decoder
    num_run = 0
    while not decoder.done and (num_steps is None or num_run < num_steps):
        record = decoder.step()
        num_run += 1
        if on_step is not None:
            on_step(record)
    return num_run


def advance(num_steps: int | None, on_step: Callable[[StepRecord], None] | None = None) -> int:
    """Run up to num_steps more steps (None: until done); returns how many ran. The first call prefills."""
    return _engine(_run_steps, num_steps, on_step)


def advance_before_run(num_steps: int | None) -> None:
    """advance() as a button's on_click callback: it runs before the page's script, so one run draws the new state
    (no second run after the click); the newest step is selected, and an engine error waits in FAILED for
    show_failure()."""
    try:
        _run_steps(num_steps, None)
    except Exception as exc:  # noqa: BLE001 - every engine error becomes a message, never a raw exception
        st.session_state[FAILED] = exc
    st.session_state.inspect_step = len(steps()) - 1


def show_failure() -> None:
    """Show the engine error a callback met (if any) and stop the page there."""
    exc = st.session_state.pop(FAILED, None)
    if exc is not None:
        show_error(exc)
        st.stop()


def tau() -> tuple[float | None, str | None]:
    """profiling.metrics' tau of the decode so far and what is shown beside it (profiling.tau_text.beside_tau: the
    tau of its steps on new text and the distinct-4-gram rate of its tokens); (None, None) before the first step."""
    decoder = current().decoder
    if decoder is None or not decoder.steps:
        return None, None
    run = decoder.record()
    new_text, new_text_steps = metrics.new_text_tau([run])
    return metrics.tau(run), beside_tau(new_text, new_text_steps, run.num_steps, metrics.distinct_4gram_rate([run]))


def generated(max_new_tokens: int) -> list[tuple[int, int]]:
    """(token, producing step) for every generated token so far, truncated as a RunRecord is; step -1 is the
    prefill."""
    decoder = current().decoder
    if decoder is None:
        return []
    out = [(decoder.first_token, -1)] + [(t, step.index) for step in decoder.steps for t in step.committed]
    return out[:max_new_tokens]


def measured(count: int | None = None) -> Measurement:
    """The current Measurement: AR and the speculative runs of the current settings after one warm-up, `count`
    repeats of them (None: as many as were measured, one when none were yet), measured once per settings and
    count; its runs are the median repeat's, so every page shows a typical run. A recording's own, whatever the
    count."""
    shown = current()
    if shown.stale(count):
        names = " and ".join(MODE_LABELS[m] for m in shown.settings.modes)
        if count is None:
            with st.spinner(f"Decoding the prompt with AR, then with {names}..."):
                _engine(shown.measure, None)
        else:
            bar = st.progress(0.0, text=f"Measuring: {count} repeats of AR and {names}...")
            _engine(shown.measure, count, lambda done, total: bar.progress(done / total,
                                                                          text=f"Repeat {done}/{total}"))
            bar.empty()
    return shown.measurement


def forget_runs() -> None:
    current().forget()


def reports(names: list[str]) -> dict[str, bytes]:
    """The exports of measured() by file name, rendered once per measurement (a recording's: with its own
    statistics, capture and environment)."""
    shown = current()
    if shown.reports is None:
        data = measured()
        shown.reports = {n: render(data, n) for n in names}
    return shown.reports


def sweep(budgets: list[int], repeats: int, on_progress: Callable[[int, int], None]) -> list[dict]:
    shown = current()
    s = shown.settings
    shown.sweep = _engine(lambda: budget_sweep(request_of(s), budgets, repeats, target_model(s), on_progress))
    return shown.sweep
