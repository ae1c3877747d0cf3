"""The drafter registry: one entry per drafter (its summary, its settings dataclass, its build function), and the
one typed spec that the CLI, the dashboard, the sweep, the profiler and the reports pass around (DrafterSpec).
A new drafter is one module (its settings dataclass with field metadata, and a build function) and one line in
REGISTRY: the CLI's flags and the sidebar's controls are generated from the settings. A drafter trained at one
block size (DFlash) names it there too, and a decode with it defaults to that block size."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.config import DecodeConfig
from engine.drafters import dflash, oracle
from engine.drafters.base import Drafter, DraftTarget
from engine.settings import ConfigError, options_of

DEFAULT_BLOCK_SIZE = next(opt.default for opt in options_of(DecodeConfig) if opt.name == "block_size")


def no_block_size(settings: Any) -> None:
    """A drafter that drafts at any block size alike (the oracle): a decode keeps DecodeConfig's default."""
    return None


@dataclass(frozen=True, slots=True)
class DrafterEntry:
    summary: str  # one sentence: what it proposes (CLI and sidebar help)
    settings: type  # a frozen dataclass whose fields carry engine.settings.Setting metadata
    build: Callable[[Any, DraftTarget], Drafter]  # (its settings, the target) -> a fresh drafter
    block_size: Callable[[Any], int | None] = no_block_size  # (its settings) -> the block size it was trained at

    @property
    def trained_block_size(self) -> bool:
        """Whether the drafter was trained at one block size (its settings name it: DFlash's checkpoint)."""
        return self.block_size is not no_block_size

    @property
    def fields(self) -> tuple[str, ...]:
        """The names of the drafter's settings, in order."""
        return tuple(f.name for f in dataclasses.fields(self.settings))


REGISTRY: dict[str, DrafterEntry] = {
    "oracle": DrafterEntry(oracle.SUMMARY, oracle.OracleSettings, oracle.build),
    "dflash": DrafterEntry(dflash.SUMMARY, dflash.DFlashSettings, dflash.build, dflash.block_size),
}


@dataclass(frozen=True, slots=True, init=False)
class DrafterSpec:
    """Which drafter, and its settings (an instance of its entry's settings dataclass, checked there).
    DrafterSpec("oracle", noise=0.3) builds the settings from keywords; a keyword the drafter does not take is
    refused, so nothing is silently dropped. A drafter's own setting reads through the spec: spec.noise."""

    name: str
    options: Any  # REGISTRY[name].settings

    def __init__(self, name: str = "oracle", options: Any = None, **fields: Any) -> None:
        entry = REGISTRY.get(name)
        if entry is None:
            raise ConfigError(f"drafter={name!r} is unknown: expected one of {sorted(REGISTRY)}")
        if options is None:
            stray = [k for k in fields if k not in entry.fields]
            if stray:
                raise ConfigError(f"drafter {name!r} does not take {', '.join(stray)}; it takes "
                                  f"{', '.join(entry.fields) or 'no settings'}")
            options = entry.settings(**fields)
        elif fields or type(options) is not entry.settings:
            raise ConfigError(f"drafter {name!r} takes one {entry.settings.__name__}, got {options!r:.200} and "
                              f"{sorted(fields)}")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "options", options)

    def __getattr__(self, field: str) -> Any:
        if field.startswith("_") or field in ("name", "options"):  # not set yet (a copy or an unpickle)
            raise AttributeError(field)
        return getattr(self.options, field)

    def settings(self) -> dict:
        """The drafter's settings by name, with their values (report.json's config.drafter, with the name)."""
        return dataclasses.asdict(self.options)

    def native_block_size(self) -> int | None:
        """The block size the drafter was trained at (a DFlash checkpoint's block_size; its loader's DFlashLoadError
        when the checkpoint cannot be read), None for one that drafts at any alike (the oracle)."""
        return REGISTRY[self.name].block_size(self.options)

    def default_block_size(self) -> int:
        """The block size a decode with this drafter takes when none is given: its native one, else DecodeConfig's
        default."""
        native = self.native_block_size()
        return DEFAULT_BLOCK_SIZE if native is None else native

    def label(self) -> str:
        """A short human label: "oracle (noise 0.3, seed 1)", "dflash (models/x/dflash)" (a text setting, a path,
        is shown alone)."""
        parts = ", ".join(v if isinstance(v, str) else f"{k} {v}" for k, v in self.settings().items())
        return f"{self.name} ({parts})" if parts else self.name


def build_drafter(spec: DrafterSpec, target: DraftTarget) -> Drafter:
    """A fresh drafter for one decode."""
    return REGISTRY[spec.name].build(spec.options, target)
