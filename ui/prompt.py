"""The sidebar's prompt: text (the default when the model has a tokenizer), the fixture's own prompt, or token
ids typed by hand. Whatever the source, the decode gets token ids."""
from __future__ import annotations

import streamlit as st

from engine.decoding.session import parse_prompt
from engine.loaders.checkpoint import Checkpoint
from engine.loaders.prompt_text import line_break_note
from ui.safe_text import plain

TEXT, FIXTURE, IDS = "text", "fixture prompt", "token ids"
LABELS = {"prompt_source": "Prompt", "prompt_box": "Prompt text", "prompt_text": "Token ids"}  # by widget key


def sources(ckpt: Checkpoint) -> list[str]:
    """The prompt inputs this model offers, the default first."""
    if ckpt.tokenizer is not None:
        return [TEXT, IDS]
    return [FIXTURE, IDS] if ckpt.prompt is not None else [IDS]


def follow_model(model: str, ckpt: Checkpoint) -> None:
    """When the sidebar's model changes, the text box takes the new model's first example prompt."""
    ss = st.session_state
    if ss.get("prompt_for") != model:
        ss.prompt_for = model
        ss.prompt_box = ckpt.prompt_texts[0] if ckpt.prompt_texts else ""
        ss.prompt_example = 0


def _use_example(texts: tuple[str, ...]) -> None:
    st.session_state.prompt_box = texts[st.session_state.prompt_example]


def widget(model: str, ckpt: Checkpoint, locked: bool = False) -> tuple[int, ...] | None:
    """Draw the prompt inputs (disabled when locked); the prompt's token ids, or None (with the error shown) while
    it is invalid."""
    st.header(LABELS["prompt_source"])
    follow_model(model, ckpt)
    source = st.radio(LABELS["prompt_source"], sources(ckpt), key="prompt_source", horizontal=True,
                      label_visibility="collapsed", disabled=locked)
    tokenizer = ckpt.tokenizer
    if source == FIXTURE:
        ids = [int(t) for t in ckpt.prompt]
        st.caption(f"{len(ids)} tokens: {', '.join(map(str, ids))}")
        return tuple(ids)
    if source == TEXT:
        texts = ckpt.prompt_texts
        if len(texts) > 1:
            st.selectbox("Example prompt", range(len(texts)), key="prompt_example", on_change=_use_example,
                         args=(texts,), format_func=lambda i: f"{i + 1}: {texts[i][:40]!r}", disabled=locked,
                         help="The model's own example prompts (prompts.json); picking one fills the box.")
        text = st.text_area(LABELS["prompt_box"], key="prompt_box", height=120, disabled=locked,
                            help=plain(f"Encoded with the model's tokenizer ({tokenizer.source})."))
        if not text:
            st.error("Prompt: the text is empty: type some text or pick an example prompt")
            return None
        note = line_break_note(text)
        if note:
            st.warning(f"Prompt: {note}")
        ids = tokenizer.encode(text)
        st.caption(f"{len(ids)} tokens: {', '.join(map(str, ids[:24]))}{', ...' if len(ids) > 24 else ''}")
        return tuple(ids)
    text = st.text_input(LABELS["prompt_text"], key="prompt_text", placeholder="e.g. 3, 14, 15, 92", disabled=locked,
                         help=f"Comma or space separated ids in [0, {ckpt.config.vocab_size}).")
    try:
        ids = parse_prompt(text, ckpt.config.vocab_size)
    except ValueError as exc:
        st.error(plain(f"Prompt: {exc}"))
        return None
    if tokenizer is not None:
        st.caption(plain(f"As text: {tokenizer.decode(ids)!r}"))
    return tuple(ids)
