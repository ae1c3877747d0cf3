"""Setting: one user-facing option described once, as dataclass field metadata, and checked from that description.

A field declared with `option(default, Setting(...))` carries its help, CLI flag, sidebar widget, step and range.
The dataclass checks the field against that range in __post_init__ (check_fields); the CLI's flags, the sidebar's
widgets and the URL's query parameters are generated from the same record, so a range is written once.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import typing
from dataclasses import dataclass
from typing import Any

WIDGETS = ("number", "slider", "select", "toggle", "text")


class ConfigError(ValueError):
    """A configuration field is missing, of the wrong type, or out of range."""


@dataclass(frozen=True, slots=True)
class Setting:
    """How one field is shown and what it may hold. lo and hi bound a number (hi None: no upper bound), lo_open
    excludes lo itself; choices list what a "select" may hold. key is the sidebar's widget key and the URL
    parameter when they are not the field's name (the decode seed is "sample_seed": "seed" is the drafter's)."""

    help: str  # one sentence for the CLI's --help and the sidebar's tooltip
    label: str  # the sidebar's label
    flag: str  # the CLI flag; its argparse dest is the flag's name ("--drafter-seed" -> drafter_seed)
    widget: str = "number"
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    step: float | None = None
    choices: tuple[str, ...] = ()
    note: str = ""  # what a special value means, e.g. "0: greedy"; said after the range
    aliases: tuple[str, ...] = ()  # more CLI flags for the same field
    metavar: str | None = None
    key: str = ""
    section: str = ""  # the sidebar's heading it sits under
    sampling_only: bool = False  # the sidebar disables it while decoding is greedy (temperature 0)

    def __post_init__(self) -> None:
        if self.widget not in WIDGETS:
            raise ValueError(f"widget={self.widget!r}: expected one of {WIDGETS}")
        if (self.widget == "select") != bool(self.choices):
            raise ValueError(f"{self.flag}: a select widget and choices come together")

    @property
    def dest(self) -> str:
        """The argparse attribute the flag fills."""
        return self.flag.lstrip("-").replace("-", "_")

    def expected(self, kind: type) -> str:
        """What the field may hold, in words: the text of every out-of-range message."""
        hi = "inf" if self.hi is None else f"{self.hi:d}" if kind is int else f"{self.hi:g}"
        if self.choices:
            text = f"one of {', '.join(self.choices)}"
        elif kind is bool:
            text = "true or false"
        elif kind is int:
            text = f"an integer in [{self.lo:d}, {hi}]"
        elif kind is float:
            text = f"a number in {'(' if self.lo_open else '['}{self.lo:g}, {hi}]"
        else:
            text = "text"
        return f"{text} ({self.note})" if self.note else text

    def check(self, name: str, kind: type, value: Any) -> Any:
        """value as a plain int, float, bool or str inside the range (numpy numbers are numbers too); else a
        ConfigError naming the field, the value and what fits."""
        ok = False
        if kind is bool:
            ok = isinstance(value, bool)
        elif kind is int and isinstance(value, numbers.Integral) and not isinstance(value, bool):
            value = int(value)
            ok = self.lo <= value and (self.hi is None or value <= self.hi)
        elif kind is float and isinstance(value, numbers.Real) and not isinstance(value, bool):
            try:
                value = float(value)
            except OverflowError:  # an int too large for a float
                value = math.inf
            ok = (self.lo < value if self.lo_open else self.lo <= value) and (self.hi is None or value <= self.hi)
        elif kind is str:
            ok = isinstance(value, str) and (not self.choices or value in self.choices)
        if not ok:
            raise ConfigError(f"{name}={value!r:.200} is out of range: expected {self.expected(kind)}")
        return value

    def parse(self, name: str, kind: type, text: str) -> Any:
        """A value from its text (a URL parameter), checked as check does; ValueError when it does not fit."""
        if kind is bool:
            if text not in ("true", "false"):
                raise ConfigError(f"{name}={text!r:.200} is out of range: expected {self.expected(kind)}")
            return text == "true"
        return self.check(name, kind, kind(text) if kind in (int, float) else text)


def option(default: Any, setting: Setting) -> Any:
    """A dataclass field with its Setting as metadata."""
    return dataclasses.field(default=default, metadata={"setting": setting})


@dataclass(frozen=True, slots=True)
class Option:
    """A field that carries a Setting, bound to its name, value type and default: what the CLI, the sidebar and
    the URL read."""

    name: str
    kind: type  # int, float, bool or str (a str | None field is str: None means "not given")
    default: Any
    setting: Setting

    @property
    def key(self) -> str:
        """The sidebar's widget key and the URL parameter."""
        return self.setting.key or self.name

    @property
    def expected(self) -> str:
        return self.setting.expected(self.kind)

    def check(self, value: Any) -> Any:
        return self.setting.check(self.name, self.kind, value)

    def parse(self, text: str) -> Any:
        return self.setting.parse(self.name, self.kind, text)


@functools.cache
def options_of(cls: type) -> tuple[Option, ...]:
    """Every field of the dataclass cls that carries a Setting, in field order."""
    hints = typing.get_type_hints(cls)
    found = []
    for f in dataclasses.fields(cls):
        if "setting" in f.metadata:
            kinds = [a for a in typing.get_args(hints[f.name]) if a is not type(None)] or [hints[f.name]]
            found.append(Option(f.name, kinds[0], f.default, f.metadata["setting"]))
    return tuple(found)


def check_fields(obj: Any) -> None:
    """Check every option of a (frozen) dataclass against its Setting and store the plain value (numpy numbers
    become ints and floats); a None is left alone where None is the default (not given)."""
    for opt in options_of(type(obj)):
        value = getattr(obj, opt.name)
        if value is not None or opt.default is not None:
            object.__setattr__(obj, opt.name, opt.check(value))
