"""A recording: a report.json (profiling.report_reader) opened in the sidebar in place of the live decode, per tab.

While one is open it is the tab's current decode (ui/current.py): the Decode page steps through its recorded steps
(profiling.replay), the Profile, Compare and Report pages read its Measurement (runs, statistics, capture), and the
controls that need the model are disabled with Opened.needs_model()'s sentence. The live decode stays as it was and
is back once the recording is closed; a file that does not open leaves everything as it was, with a message saying why.
A file is read in a background thread (ui/loading.py) with a progress bar in the sidebar, so every page stays usable
while a large recording is checked; one read within GRACE_S opens at once.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import streamlit as st

from engine.config import DecodeConfig
from engine.drafters import REGISTRY, DrafterSpec
from engine.records import MODE_LABELS, TREES
from profiling.replay import Replay
from profiling.report_reader import Progress, RecordedVocabulary, Recording, read_report, read_report_file
from ui import loading
from ui.current import Current
from ui.safe_text import plain
from ui.settings import Settings

GRACE_S = 1.0  # a report read this fast opens without a progress bar
POLL_S = 0.5


@dataclass(slots=True, kw_only=True)
class Opened(Current):
    """The open recording as the tab's current decode: its Measurement is the file's, its stepper a Replay."""

    recording: Recording

    def tokenizer(self) -> RecordedVocabulary | None:
        return self.recording.vocabulary

    def start(self) -> Replay:
        return Replay(self.recording.runs[self.settings.stepped_mode])

    def reset(self) -> None:
        self.decoder = self.start()

    def stale(self, count: int | None) -> bool:
        return False  # its repeats were measured where it ran, whatever the count asked

    def needs_model(self) -> str | None:
        return (f"A recording: its {self.recording.repeats.count} repeat(s) were measured where it ran, and decoding "
                "again needs the model. Close the recording (sidebar) to decode live.")


def opened(recording: Recording) -> Opened:
    """A recording, ready to show: nothing stepped yet, its own capture (if it was recorded with one)."""
    shown = Opened(settings_of(recording), measurement=recording, recording=recording,
                   captured=recording if recording.capture is not None else None)
    shown.reset()
    return shown


def init() -> None:
    st.session_state.setdefault("recording", None)
    st.session_state.setdefault("report_error", None)
    st.session_state.setdefault("report_loading", None)


def current() -> Opened | None:
    return st.session_state.get("recording")


def settings_of(recording: Recording) -> Settings:
    """The sidebar settings the recorded runs were decoded with."""
    run = recording.runs[recording.primary]
    drafter = run.drafter
    spec = DrafterSpec(drafter["name"], **{f: drafter[f] for f in REGISTRY[drafter["name"]].fields})
    modes = tuple(m for m in recording.runs if m != "ar")
    tree = next(name for name, value in TREES.items() if value == modes)
    return Settings(model=f"{recording.name} (recorded)", model_id=f"recording:{recording.digest}",
                    prompt=tuple(run.prompt), drafter=spec, tree=tree,
                    # fields added later take their defaults; one made before the batch-invariant setting was fast
                    config=DecodeConfig(**{"batch_invariant": False, **run.decode}))


def _open(read: Callable[[Progress], Recording], name: str) -> None:
    """Read a report in a background thread (ui/loading.py); one that opens within GRACE_S opens at once."""
    ss = st.session_state
    ss.report_error = None
    ss.report_loading = loading.start(read, name)
    _finish_if_done(wait=GRACE_S)


def _finish_if_done(wait: float = 0.0) -> bool:
    """Open the loaded recording, or keep its error; True once the background read is over."""
    ss = st.session_state
    done = ss.report_loading.wait(wait)
    if done is not None:
        ss.report_loading = None
        if isinstance(done, str):
            ss.report_error = done
        else:
            ss.recording = opened(done)
    return done is not None


def _on_upload() -> None:
    file = st.session_state.report_upload
    if file is not None:
        data, name = file.getvalue(), file.name
        _open(lambda progress: read_report(data, name, progress), name)


def _on_path() -> None:
    path = st.session_state.report_path.strip()
    if path:
        _open(lambda progress: read_report_file(path, progress), path)


@st.fragment(run_every=POLL_S)
def _progress() -> None:
    """The background read's progress bar, polled; once it is over, the whole page again (the recording, or the
    error below)."""
    if st.session_state.report_loading is None or _finish_if_done():
        st.rerun(scope="app")
    state = st.session_state.report_loading
    st.progress(state.fraction, text=plain(f"Opening {state.name}: {state.what} ({state.seconds:.0f} s)"))


def _close() -> None:
    st.session_state.recording = None
    st.session_state.report_error = None


def sidebar() -> None:
    """The sidebar's recording section: open a report.json (upload or a path on this server), or close it."""
    opened = current()
    with st.sidebar:
        st.header("Recording")
        if opened is not None:
            st.caption(f"Showing **{plain(opened.recording.name)}** on every page.")
            st.button("Close the recording", on_click=_close)
        st.file_uploader("Open a report", type=["json"], key="report_upload", on_change=_on_upload,
                         help="A report.json that `python -m engine run --report DIR` wrote, here or on another "
                              "machine (a GPU server): every page shows it as it shows a live decode.")
        st.text_input("Or a report path", key="report_path", on_change=_on_path, placeholder="out/report.json",
                      help="The path of a report.json on this server.")
        if st.session_state.report_loading is not None:  # polled only while a read runs
            _progress()
        error = st.session_state.report_error
        if error:
            still = f"Still showing {opened.recording.name}." if opened is not None else "Still decoding live."
            st.error(plain(f"{error} {still}"))


def _model_line(model: dict) -> str:
    moe = model["num_hidden_layers"] - model["first_k_dense_replace"]
    experts = (f", {moe} MoE layers of {model['n_routed_experts']} routed experts (top-{model['num_experts_per_tok']})"
               if moe > 0 else "")
    return f"{model['num_hidden_layers']} layers, hidden {model['hidden_size']}, vocabulary {model['vocab_size']}" \
           + experts


def banner() -> None:
    """What every page says while a recording is open: where it ran, at which commit, the model and settings."""
    opened = current()
    if opened is None:
        return
    rec, s = opened.recording, opened.settings
    env = rec.environment
    commit = env["git_commit"][:12] if env["git_commit"] else "no git commit"
    dirty = " with uncommitted changes" if env.get("git_dirty") else ""
    cuda = f", CUDA {env['cuda']}" if env["cuda"] else ""
    modes = " and ".join(MODE_LABELS[m] for m in rec.runs)
    st.info("**A recording**, not a live decode: " + plain(
            f"{rec.name} ({rec.size / 1e6:.1f} MB, SHA-256 {rec.digest[:12]}), "
            f"recorded on {env['device_name']} ({env['device']}, torch {env['torch']}{cuda}, Python {env['python']}, "
            f"{env['platform']}) at commit {commit}{dirty}. Model: {_model_line(rec.runs['ar'].model)}. Settings: "
            f"{modes}; {s.drafter.label()} drafter; B = {s.config.budget_label}, block size {s.config.block_size}, "
            f"{s.config.max_new_tokens} new tokens, {s.config.sampling}, {s.config.device} {s.config.dtype}"
            f"{', batch-invariant' if s.config.batch_invariant else ''}; {rec.repeats.count} repeat(s). Step replays "
            "its recorded steps; close it in the sidebar to decode live."))
