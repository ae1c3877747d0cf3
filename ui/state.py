"""Per-tab state in st.session_state and the actions that change it.

Each browser tab has its own session_state, so two tabs never share a decoder. Keys (set up once by init()):
  settings  Settings the current decode was built with (None while the sidebar holds an invalid prompt)
  decoder   the step-wise decoder of the Decode page, DDTree or chain (None until the first Step)
  runs      mode -> RunRecord, AR first (decode_runs), for the Profile, Compare and Report pages (None until needed)
  repeats   the Profile page's repeated runs (profiling.repeats.repeat_runs; None until needed); runs is then
            their median repeat
  reports   export file name -> bytes rendered from runs (None until the Report page asks)
  sweep     the budget sweep's rows (None until run)
  uploads   uploaded or path-loaded checkpoints that loaded, by display name
  model_ids their identities (ui.settings.model_id), by display name
  recording a report.json opened in place of all this (ui/recorded.py); while it is open, settings(), the decoder
            calls, runs(), statistics(), summaries() and reports() answer from it, and the keys above stay as they were
"""
from __future__ import annotations

import dataclasses
import traceback
from collections.abc import Callable

import streamlit as st

from engine.decoding.session import decode_runs, make_decoder
from engine.drafters import DrafterSpec
from engine.model.target import TargetModel
from engine.records import MODE_LABELS, RunRecord, StepRecord
from engine.timers import StepTimer
from kernels import ExtensionBuildError
from profiling import metrics
from profiling.repeats import RepeatStats, median_repeat, repeat_runs, repeat_stats
from profiling.report import render, render_data
from profiling.sweep import budget_sweep
from ui import recorded, resources
from ui.safe_text import plain
from ui.settings import Settings, checkpoint


def init() -> None:
    ss = st.session_state
    ss.setdefault("settings", None)
    ss.setdefault("decoder", None)
    ss.setdefault("runs", None)
    ss.setdefault("repeats", None)
    ss.setdefault("reports", None)
    ss.setdefault("sweep", None)
    ss.setdefault("uploads", {})
    ss.setdefault("model_ids", {})
    ss.setdefault("upload_error", None)
    recorded.init()


def settings() -> Settings | None:
    """The settings every page shows: the open recording's, else the sidebar's."""
    opened = recorded.current()
    return opened.settings if opened is not None else st.session_state.settings


def tokenizer():
    """What turns the shown tokens into text: the model's tokenizer, a recording's vocabulary (None: neither)."""
    opened = recorded.current()
    if opened is not None:
        return opened.recording.vocabulary
    return checkpoint(st.session_state.settings.model).tokenizer


def apply(new: Settings | None) -> str | None:
    """Adopt the sidebar's settings; when they differ from the current ones, drop every decode made with the
    old ones and return a message naming what changed."""
    ss = st.session_state
    old = ss.settings
    if new == old:
        return None
    ss.settings = new
    ss.decoder, ss.runs, ss.repeats, ss.reports, ss.sweep = None, None, None, None, None
    if old is None or new is None:
        return None
    changed = []
    for f in dataclasses.fields(Settings):
        a, b = getattr(old, f.name), getattr(new, f.name)
        if a == b or (f.name == "model_id" and old.model != new.model):
            continue
        if f.name == "model_id":
            changed.append(f"model {new.model} changed on disk and was loaded again")
            continue
        if isinstance(a, DrafterSpec) and a.name == b.name:  # the drafter's own settings, one by one
            changed += [f"{k} {_short(v)} -> {_short(b.settings()[k])}" for k, v in a.settings().items()
                        if v != b.settings()[k]]
        else:
            changed.append(f"{f.name} {_short(a)} -> {_short(b)}")
    return f"Settings changed ({'; '.join(changed)}): the decode was reset."


def _short(value: object) -> str:
    """A setting's text; a long prompt is cut to its first tokens (paths and names are shown whole)."""
    if isinstance(value, DrafterSpec):
        return value.label()
    if isinstance(value, tuple):
        text = ", ".join(map(str, value[:8]))
        return text + (f", ... ({len(value)} tokens)" if len(value) > 8 else "")
    return str(value)


def _model(s: Settings) -> TargetModel:
    return _engine(resources.target_model, s.model_id, checkpoint(s.model), s.device, s.dtype)


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


def _decoder():
    """The Decode page's decoder: the live one (None before the first Step), or the open recording's replay."""
    opened = recorded.current()
    return opened.replay if opened is not None else st.session_state.decoder


def reset() -> None:
    opened = recorded.current()
    if opened is not None:
        opened.rewind()
    else:
        st.session_state.decoder = None


def steps() -> list[StepRecord]:
    decoder = _decoder()
    return [] if decoder is None else decoder.steps


def done() -> bool:
    decoder = _decoder()
    return decoder is not None and decoder.done


def advance(num_steps: int | None, on_step: Callable[[StepRecord], None] | None = None) -> int:
    """Run up to num_steps more steps (None: until done); returns how many ran. The first call prefills."""
    ss = st.session_state
    decoder = _decoder()
    if decoder is None:
        s = ss.settings
        decoder = ss.decoder = _engine(make_decoder, checkpoint(s.model), list(s.prompt), s.decode_config(),
                                       s.stepped_mode, s.drafter, timer=StepTimer(s.device), model=_model(s))
    num_run = 0
    while not decoder.done and (num_steps is None or num_run < num_steps):
        record = _engine(decoder.step)
        num_run += 1
        if on_step is not None:
            on_step(record)
    return num_run


def tau() -> float | None:
    """profiling.metrics' tau of the decode so far (None before the first step)."""
    decoder = _decoder()
    return None if decoder is None else metrics.tau(decoder.record())


def generated(max_new_tokens: int) -> list[tuple[int, int]]:
    """(token, producing step) for every generated token so far, truncated as a RunRecord is; step -1 is the
    prefill."""
    decoder = _decoder()
    if decoder is None:
        return []
    out = [(decoder.first_token, -1)] + [(t, step.index) for step in decoder.steps for t in step.committed]
    return out[:max_new_tokens]


def runs() -> dict[str, RunRecord]:
    """AR and the speculative runs of the current settings, decoded once per settings (profiled); a recording's."""
    ss = st.session_state
    opened = recorded.current()
    if opened is not None:
        return opened.recording.runs
    if ss.runs is None:
        s = ss.settings
        names = " and ".join(MODE_LABELS[m] for m in s.modes)
        with st.spinner(f"Decoding the prompt with AR, then with {names}..."):
            ss.runs = _engine(decode_runs, checkpoint(s.model), list(s.prompt), s.decode_config(), s.drafter,
                              s.modes, profile_timers=True, model=_model(s))
    return ss.runs


def forget_runs() -> None:
    st.session_state.runs = st.session_state.repeats = st.session_state.reports = None


def repeated(count: int) -> list[dict[str, RunRecord]]:
    """`count` repeats of the current settings' runs (one warm-up first), measured once per settings and count;
    runs() becomes their median repeat, so the other pages show a typical run."""
    ss = st.session_state
    if ss.repeats is None or len(ss.repeats) != count:
        s = ss.settings
        names = " and ".join(MODE_LABELS[m] for m in s.modes)
        bar = st.progress(0.0, text=f"Measuring: {count} repeats of AR and {names}...")
        ss.repeats = _engine(repeat_runs, checkpoint(s.model), list(s.prompt), s.decode_config(), count, s.drafter,
                             s.modes, model=_model(s),
                             on_progress=lambda done, total: bar.progress(done / total, text=f"Repeat {done}/{total}"))
        bar.empty()
        ss.runs, ss.reports = median_repeat(ss.repeats, s.stepped_mode), None
    return ss.repeats


def statistics(count: int) -> RepeatStats:
    """The statistics of `count` repeats (repeated()); a recording's own, whatever the count."""
    opened = recorded.current()
    return opened.recording.repeats if opened is not None else repeat_stats(repeated(count))


def summaries(runs: dict[str, RunRecord]) -> dict[str, dict]:
    """metrics.summarize_runs; a recording's runs keep their recorded divergence verdicts (profiling.report_reader)."""
    opened = recorded.current()
    if opened is not None and runs is opened.recording.runs:
        return opened.recording.summaries
    return metrics.summarize_runs(runs)


def reports(names: list[str]) -> dict[str, bytes]:
    """The exports of runs() by file name, rendered once per set of runs: with the Profile page's repeat statistics
    when runs() is their median repeat; a recording's with its own statistics, capture and environment."""
    ss = st.session_state
    opened = recorded.current()
    if opened is not None:
        if opened.reports is None:
            data = opened.recording.report_data()
            opened.reports = {n: render_data(data, n) for n in names}
        return opened.reports
    if ss.reports is None:
        runs_now = runs()
        stats = repeat_stats(ss.repeats) if ss.repeats is not None else None
        ss.reports = {n: render(runs_now, n, repeats=stats) for n in names}
    return ss.reports


def sweep(budgets: list[int], repeats: int, on_progress: Callable[[int, int], None]) -> list[dict]:
    ss = st.session_state
    s = ss.settings
    ss.sweep = _engine(budget_sweep, checkpoint(s.model), list(s.prompt), s.decode_config(), budgets, s.drafter,
                       on_progress=on_progress, model=_model(s), repeats=repeats)
    return ss.sweep
