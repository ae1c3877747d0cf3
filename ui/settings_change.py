"""What changed between two sidebar settings, in the sidebar's own words: each control's label and its values as
the sidebar shows them ("Verify DDTree -> chain and DDTree; Budget B (tree nodes) 64 -> 16")."""
from __future__ import annotations

from typing import Any

from engine.settings import Option, options_of
from ui.settings import LABELS, TREE_LABELS, Settings

PROMPT_SHOWN = 8  # a changed prompt is shown by its first tokens


def changes(old: Settings, new: Settings) -> list[str]:
    """One "label old -> new" per control that differs (a drafter's own settings one by one)."""
    out = []
    if old.model != new.model:
        out.append(f"{LABELS['model']} {old.model} -> {new.model}")
    elif old.model_id != new.model_id:
        out.append(f"model {new.model} changed on disk and was loaded again")
    if old.prompt != new.prompt:
        out.append(f"{LABELS['prompt']} {_tokens(old.prompt)} -> {_tokens(new.prompt)}")
    if old.drafter.name != new.drafter.name:
        out.append(f"{LABELS['drafter']} {old.drafter.label()} -> {new.drafter.label()}")
    else:
        out += _options(old.drafter.options, new.drafter.options)
    if old.tree != new.tree:
        out.append(f"{LABELS['tree']} {TREE_LABELS[old.tree]} -> {TREE_LABELS[new.tree]}")
    return out + _options(old.config, new.config)


def _options(old: Any, new: Any) -> list[str]:
    """The options (engine.settings) of two instances of one settings dataclass that differ, by their labels."""
    return [f"{opt.setting.label} {_value(opt, getattr(old, opt.name))} -> {_value(opt, getattr(new, opt.name))}"
            for opt in options_of(type(old)) if getattr(old, opt.name) != getattr(new, opt.name)]


def _value(opt: Option, value: Any) -> str:
    """A value as its widget shows it: a toggle on or off, an empty text box as none."""
    if opt.setting.widget == "toggle":
        return "on" if value else "off"
    return "none" if value is None else str(value)


def _tokens(prompt: tuple[int, ...]) -> str:
    text = ", ".join(map(str, prompt[:PROMPT_SHOWN]))
    return text + (f", ... ({len(prompt)} tokens)" if len(prompt) > PROMPT_SHOWN else "")

