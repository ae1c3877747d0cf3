"""Shareable views: the sidebar's settings mirrored in the page's query parameters (st.query_params), so that a
reload or a pasted link reopens the same model, prompt, drafter, budget and sampling settings.

restore() reads the link once per tab, before the widgets are drawn; save() writes the current values after
each run. What cannot survive a reload: an uploaded file (its bytes live only in the tab that uploaded it) and
the decode itself (the steps taken, the measured runs); restore() says so when a link names an upload.
"""
from __future__ import annotations

from collections.abc import Callable

import streamlit as st

from engine.config import DTYPES, MAX_BLOCK_SIZE, MAX_BUDGET, MAX_POSITIONS, MAX_TEMPERATURE, MIN_BLOCK_SIZE
from engine.drafters import REGISTRY
from engine.loaders.shipped import bundled_models
from engine.records import TREES
from ui import prompt, resources


def _int(lo: int, hi: int | None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if value < lo or (hi is not None and value > hi):
            raise ValueError
        return value
    parse.expected = f"an integer in [{lo}, {hi if hi is not None else 'inf'}]"
    return parse


def _float(lo: float, hi: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = float(text)
        if not lo <= value <= hi:
            raise ValueError
        return value
    parse.expected = f"a number in [{lo:g}, {hi:g}]"
    return parse


def _choice(options) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in options:
            raise ValueError
        return text
    parse.expected = f"one of {', '.join(options)}"
    return parse


def _text(text: str) -> str:
    return text


def _bool(text: str) -> bool:
    if text not in ("true", "false"):
        raise ValueError
    return text == "true"


_text.expected, _bool.expected = "text", "true or false"

# widget key -> parser of its query-parameter text (raises ValueError when out of range; .expected says what fits)
FIELDS: dict[str, Callable[[str], object]] = {
    "prompt_source": _choice((prompt.TEXT, prompt.FIXTURE, prompt.IDS)), "prompt_box": _text, "prompt_text": _text,
    "drafter": _choice(tuple(REGISTRY)), "noise": _float(0.0, 1.0), "seed": _int(0, None), "drafter_model": _text,
    "verify_tree": _choice(tuple(TREES)), "budget": _int(0, MAX_BUDGET),
    "block_size": _int(MIN_BLOCK_SIZE, MAX_BLOCK_SIZE), "max_new_tokens": _int(1, MAX_POSITIONS),
    "device": _choice(("cpu", "cuda")), "dtype": _choice(DTYPES), "temperature": _float(0.0, MAX_TEMPERATURE),
    "top_k": _int(0, None), "top_p": _float(0.01, 1.0), "sample_seed": _int(0, None), "batch_invariant": _bool,
}


def _restore_model(name: str) -> str | None:
    """Select the linked model: a shipped one by name, or a path on this server loaded again; returns why not."""
    ss = st.session_state
    if name in bundled_models():
        ss.model = name
        return None
    try:
        ss.uploads[name] = resources.load_path(name)
        ss.model_ids[name] = resources.identity(name)
    except (ValueError, OSError) as exc:
        upload = name.endswith(")") and " (" in name
        return (f"model {name!r} is an upload, and uploads do not survive a reload: upload the file again"
                if upload else f"model {name!r} did not load ({exc})")
    ss.model = name
    return None


def restore() -> None:
    """Adopt the link's settings, once per tab; the ones that do not fit are named in a notice."""
    ss = st.session_state
    if ss.get("query_restored"):
        return
    ss.query_restored = True
    params = st.query_params.to_dict()
    problems = []
    if "model" in params:
        problem = _restore_model(params["model"])
        if problem:
            problems.append(problem)
    ss.setdefault("model", next(iter(bundled_models())))
    for key, parse in FIELDS.items():
        if key not in params:
            continue
        try:
            ss[key] = parse(params[key])
        except ValueError:
            problems.append(f"{key}={params[key]!r:.60} (expected {parse.expected})")
    # the linked prompt and drafter belong to the linked model: its own defaults must not replace them
    if any(key in params for key in ("prompt_source", "prompt_box", "prompt_text")):
        ss.prompt_for = ss.model
    if any(key in params for key in ("drafter", "drafter_model")):
        ss.drafter_for = ss.model
    if problems:
        ss.query_notice = ("The link's settings were partly used; these were not, the defaults stand in: "
                           f"{'; '.join(problems)}.")


def save() -> None:
    """Write the sidebar's current values into the page's query parameters."""
    ss = st.session_state
    values = {"model": ss.model} | {key: ss[key] for key in FIELDS if key in ss}
    text = {key: str(v).lower() if isinstance(v, bool) else str(v) for key, v in values.items()}
    if st.query_params.to_dict() != text:
        st.query_params.from_dict(text)


def notice() -> str | None:
    """The restore's notice, shown once."""
    return st.session_state.pop("query_notice", None)
