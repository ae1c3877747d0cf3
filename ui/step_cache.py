"""A tab's memo of what the Decode page derives from one step (its figures and table rows): a rerun that shows the
same step (a click elsewhere, a new step's run showing the tree again) reuses them instead of building them anew.

Entries are keyed by the step object itself (kept beside the value, so a reset's or another decode's new step
never reads an old entry) and by what else the value depends on (the focus node, the mask's extent); the oldest
go first past SIZE."""
from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TypeVar

import streamlit as st

from engine.records import StepRecord

KEY = "step_cache"
SIZE = 64
T = TypeVar("T")


def cached(name: str, step: StepRecord, extra: Hashable, make: Callable[[], T]) -> T:
    """make()'s value for (name, step, extra), built once while it stays among the SIZE newest."""
    cache = st.session_state.setdefault(KEY, {})
    key = (name, id(step), extra)
    hit = cache.get(key)
    if hit is not None and hit[0] is step:
        return hit[1]
    value = make()
    cache[key] = (step, value)
    while len(cache) > SIZE:
        cache.pop(next(iter(cache)))
    return value
