"""Shareable views: the sidebar's settings mirrored in the page's query parameters (st.query_params), so that a
reload or a pasted link reopens the same model, prompt, drafter, budget and sampling settings.

restore() reads the link once per tab, before the widgets are drawn; save() writes the current values after
each run. What cannot survive a reload: an uploaded file (its bytes live only in the tab that uploaded it) and
the decode itself (the steps taken, the measured runs); restore() says so when a link names an upload.
"""
from __future__ import annotations

from collections.abc import Callable

import streamlit as st

from engine.drafters import REGISTRY
from engine.loaders.shipped import bundled_models
from engine.records import TREES
from ui import prompt, resources
from ui.settings import setting_options

Parser = tuple[Callable[[str], object], str]  # (text -> value, raising ValueError when it does not fit; what fits)


def _choice(options) -> Parser:
    def parse(text: str) -> str:
        if text not in options:
            raise ValueError
        return text
    return parse, f"one of {', '.join(options)}"


_TEXT: Parser = (str, "text")


def fields() -> dict[str, Parser]:
    """Widget key -> the parser of its query-parameter text: the sidebar's own choices, and every setting's
    (engine.settings.Setting.parse: the config's range and its words)."""
    return {"prompt_source": _choice((prompt.TEXT, prompt.FIXTURE, prompt.IDS)), "prompt_box": _TEXT,
            "prompt_text": _TEXT, "drafter": _choice(tuple(REGISTRY)), "verify_tree": _choice(tuple(TREES)),
            **{opt.key: (opt.parse, opt.expected) for opt in setting_options()}}


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
    for key, (parse, expected) in fields().items():
        if key not in params:
            continue
        try:
            ss[key] = parse(params[key])
        except ValueError:
            problems.append(f"{key}={params[key]!r:.60} (expected {expected})")
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
    values = {"model": ss.model} | {key: ss[key] for key in fields() if key in ss}
    text = {key: str(v).lower() if isinstance(v, bool) else str(v) for key, v in values.items()}
    if st.query_params.to_dict() != text:
        st.query_params.from_dict(text)


def notice() -> str | None:
    """The restore's notice, shown once."""
    return st.session_state.pop("query_notice", None)
