"""Shareable views: the sidebar's settings mirrored in the page's query parameters (st.query_params), so that a
reload or a pasted link reopens the same model, prompt, drafter, budget and sampling settings.

restore() reads the link once per tab, before the widgets are drawn, and takes each value only where its widget
holds it with this model on this machine; notice() then names every parameter it did not take (what was asked, what
the sidebar holds there and why, the value kept). save() writes the current values after each run. What cannot
survive a reload: an uploaded file (its bytes live only in the tab that uploaded it) and the decode itself (the
steps taken, the measured runs); the notice says so when a link names an upload.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import streamlit as st

from engine.drafters import REGISTRY
from engine.loaders.checkpoint import Checkpoint
from engine.loaders.shipped import bundled_models
from engine.records import TREES
from engine.settings import Option
from ui import prompt, resources
from ui.settings import LABELS, checkpoint, given_batch_invariant, given_block_size, offered, setting_options


@dataclass(frozen=True, slots=True)
class Field:
    """A query parameter as its sidebar widget takes it: parse (text -> value, ValueError when the widget would not
    hold it), what it holds in words, and why that is less than its setting allows ("" when it is not)."""

    label: str  # the widget's label, as the notice names it
    parse: Callable[[str], object]
    expected: str
    why: str = ""


def _choice(label: str, options, why: str = "") -> Field:
    def parse(text: str) -> str:
        if text not in options:
            raise ValueError
        return text
    return Field(label, parse, f"one of {', '.join(options)}", why)


def _setting(opt: Option, ckpt: Checkpoint) -> Field:
    """A setting's parameter, parsed as the config parses it (engine.settings.Setting.parse) within the range and
    choices its widget offers here (ui.settings.offered): a value the widget would not hold never reaches it, where
    Streamlit would put its least value in its place."""
    shown, why = offered(opt, ckpt)
    return Field(shown.setting.label, shown.parse, shown.expected, why)


def fields(model: str, ckpt: Checkpoint) -> dict[str, Field]:
    """Widget key -> its query parameter, as the sidebar takes it with this model on this machine: the prompt's
    sources this model offers, the drafters, the verify modes, and every setting."""
    labels = prompt.LABELS
    here = prompt.sources(ckpt)
    without = "" if prompt.TEXT in here else f"{model} has no tokenizer"
    return {"prompt_source": _choice(labels["prompt_source"], here, without),
            "prompt_box": Field(labels["prompt_box"], str, "text"),
            "prompt_text": Field(labels["prompt_text"], str, "text"),
            "drafter": _choice(LABELS["drafter"], tuple(REGISTRY)),
            "verify_tree": _choice(LABELS["tree"], tuple(TREES)),
            **{opt.key: _setting(opt, ckpt) for opt in setting_options()}}


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
    """Adopt the link's settings, once per tab; the ones the sidebar would not hold are named in a notice (notice())
    and left at their defaults."""
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
    refused, adopted = {}, set()
    for key, field in fields(ss.model, checkpoint(ss.model)).items():
        if key not in params:
            continue
        try:
            ss[key] = field.parse(params[key])
            adopted.add(key)
        except ValueError:
            refused[key] = (field, params[key])
    # the linked prompt and drafter belong to the linked model: its own defaults must not replace them (they do
    # where the link's were refused)
    if adopted & {"prompt_source", "prompt_box", "prompt_text"}:
        ss.prompt_for = ss.model
    if adopted & {"drafter", "drafter_model"}:
        ss.drafter_for = ss.model
    if "block_size" in adopted:
        given_block_size()
    if "batch_invariant" in adopted:
        given_batch_invariant()
    if problems or refused:
        ss.query_problems = (problems, refused)


def save() -> None:
    """Write the sidebar's current values into the page's query parameters."""
    ss = st.session_state
    values = {"model": ss.model} | {key: ss[key] for key in fields(ss.model, checkpoint(ss.model)) if key in ss}
    text = {key: _text(v) for key, v in values.items()}
    if st.query_params.to_dict() != text:
        st.query_params.from_dict(text)


def _text(value: object) -> str:
    """A widget's value as its query parameter holds it (a toggle's true or false)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def notice() -> str | None:
    """The restore's notice, shown once, after the sidebar is drawn: per parameter it did not use, what the link
    asked, what the sidebar holds, why, and the value it kept (the widget's value now)."""
    problems, refused = st.session_state.pop("query_problems", ([], {}))
    for key, (field, given) in refused.items():
        kept = st.session_state.get(key)
        why = f" ({field.why})" if field.why else ""
        problems.append(f"{field.label}: {key}={given!r:.60} is not {field.expected}{why}; "
                        + ("the default stands in" if kept is None else f"kept {_text(kept)}"))
    if not problems:
        return None
    return f"The link's settings were partly used; these were not: {'; '.join(problems)}."
