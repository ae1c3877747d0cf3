"""A Setting drawn as its sidebar widget: the label, tooltip, step and range all come from the field's metadata
(engine.settings), so the sidebar offers exactly what the config accepts."""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import streamlit as st

from engine.settings import Option

MAX_SAFE_INTEGER = 2**53 - 1  # the browser holds integers exactly up to here (Streamlit refuses larger bounds)


def tooltip(opt: Option, extra: str = "") -> str:
    """The Setting's help as a sentence, what it may hold, and extra (a page's own remark)."""
    s = opt.setting
    text = f"{s.help[0].upper()}{s.help[1:]}."
    if opt.kind in (int, float):
        text += f" {opt.expected[0].upper()}{opt.expected[1:]}."
    return f"{text} {extra}".strip()


def number_bounds(opt: Option) -> tuple[Any, Any]:
    """The widget's inclusive bounds: an open lower bound (top-p's 0) becomes the next float above it; an integer
    bound stops at what the browser holds exactly (the sampling seed's 2^63 - 1)."""
    s = opt.setting
    lo = math.nextafter(s.lo, math.inf) if s.lo_open else opt.kind(s.lo)
    hi = None if s.hi is None else opt.kind(s.hi)
    return lo, min(hi, MAX_SAFE_INTEGER) if opt.kind is int and hi is not None else hi


def draw(opt: Option, *, disabled: bool = False, choices: Sequence[str] | None = None, hi: Any = None,
         extra: str = "") -> Any:
    """Draw the option's widget under its key and return its value as the field's type. choices narrows a select
    (the devices this machine has), hi a number's upper bound (what the model's context holds)."""
    s = opt.setting
    common = {"key": opt.key, "help": tooltip(opt, extra), "disabled": disabled}
    if s.widget == "select":
        return st.selectbox(s.label, list(s.choices if choices is None else choices), **common)
    if s.widget == "toggle":
        return bool(st.toggle(s.label, **common))
    if s.widget == "text":
        return st.text_input(s.label, **common).strip()
    lo, top = number_bounds(opt)
    top = top if hi is None else (hi if top is None else min(hi, top))
    step = opt.kind(s.step) if s.step is not None else None
    if s.widget == "slider":
        return opt.kind(st.slider(s.label, lo, top, step=step, **common))
    return opt.kind(st.number_input(s.label, lo, top, step=step, **common))
