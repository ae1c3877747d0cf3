"""A Setting drawn as its sidebar widget: the label, tooltip, step and range all come from the field's metadata
(engine.settings), so the sidebar offers what the config accepts, narrowed (narrowed()) only where the browser, the
model or the machine holds less."""
from __future__ import annotations

import dataclasses
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


def narrowed(opt: Option, *, hi: Any = None, choices: Sequence[str] | None = None) -> Option:
    """opt as its widget offers it: an integer at most what the browser holds exactly (the sampling seed's 2^63 - 1
    and an unbounded integer stop at 2^53 - 1), a number at most hi (what the model's context holds), a select
    among choices (the devices this machine has)."""
    s = opt.setting
    top = s.hi
    if opt.kind is int and (top is None or top > MAX_SAFE_INTEGER):
        top = MAX_SAFE_INTEGER
    if hi is not None and (top is None or hi < top):
        top = hi
    changed = {"hi": top} if top != s.hi else {}
    if choices is not None and tuple(choices) != s.choices:
        changed["choices"] = tuple(choices)
    return dataclasses.replace(opt, setting=dataclasses.replace(s, **changed)) if changed else opt


def number_bounds(opt: Option) -> tuple[Any, Any]:
    """The widget's inclusive bounds (of a narrowed option): an open lower bound (top-p's 0) becomes the next float
    above it."""
    s = opt.setting
    lo = math.nextafter(s.lo, math.inf) if s.lo_open else opt.kind(s.lo)
    return lo, None if s.hi is None else opt.kind(s.hi)


def draw(opt: Option, *, disabled: bool = False, extra: str = "") -> Any:
    """Draw the option's widget under its key and return its value as the field's type; opt is narrowed() to what
    this machine and model offer (its range and choices are the widget's)."""
    s = opt.setting
    common = {"key": opt.key, "help": tooltip(opt, extra), "disabled": disabled}
    if s.widget == "select":
        return st.selectbox(s.label, list(s.choices), **common)
    if s.widget == "toggle":
        return bool(st.toggle(s.label, **common))
    if s.widget == "text":
        return st.text_input(s.label, **common).strip()
    lo, hi = number_bounds(opt)
    step = opt.kind(s.step) if s.step is not None else None
    if s.widget == "slider":
        return opt.kind(st.slider(s.label, lo, hi, step=step, **common))
    return opt.kind(st.number_input(s.label, lo, hi, step=step, **common))
