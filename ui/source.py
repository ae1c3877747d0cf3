"""Which decode the Profile and Compare pages measure: a fresh measured run (the current Measurement) or the decode
stepped through on the Decode page, its own records (timings and tokens) beside the fresh AR run; while a recording
is open (ui/recorded.py), its runs alone."""
from __future__ import annotations

import streamlit as st

from engine.decoding.session import with_text
from engine.records import MODE_LABELS
from profiling.measurement import Measurement
from ui import recorded, state
from ui.safe_text import plain
from ui.settings import checkpoint

FRESH, STEPPED, RECORDED = "a fresh measured run", "the decode you stepped", "the recording"


def pick(key: str) -> str:
    """The source radio; the stepped decode is offered once it has run to the end. A recording is the only source
    while it is open."""
    opened = recorded.current()
    if opened is not None:
        st.caption(f"Source: the recording {plain(opened.recording.name)}, its own runs, timings and statistics.")
        return RECORDED
    options = [FRESH, STEPPED] if state.done() else [FRESH]
    source = st.radio("Source", options, key=key, horizontal=True,
                      help="The decode you stepped is offered once it is done (Decode page: Run to end).")
    if source == STEPPED:
        s = state.settings()
        st.caption(f"Measuring the {MODE_LABELS[s.stepped_mode]} decode you stepped on the Decode page "
                   f"({len(state.steps())} steps: its own timings and tokens) beside a fresh AR run; one decode, "
                   "so no spread.")
    return source


def stepped() -> Measurement:
    """The fresh AR run and the stepped decode's record, measured as one decode (one repeat)."""
    live = state.current()
    record = with_text(live.decoder.record(), checkpoint(live.settings.model))
    return Measurement.of({"ar": state.measured().runs["ar"], live.settings.stepped_mode: record})
