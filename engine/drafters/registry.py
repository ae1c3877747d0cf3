"""The drafter registry: one entry per drafter, and the one typed spec that the CLI, the dashboard, the sweep,
the profiler and the reports pass around (DrafterSpec). A new drafter is a module and an entry here."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

from engine.config import ConfigError
from engine.drafters import dflash, oracle
from engine.drafters.base import Drafter, DraftTarget


@dataclass(frozen=True, slots=True)
class DrafterSpec:
    """Which drafter and its settings. Each drafter reads only its entry's fields; the others keep their
    defaults (a spec that sets a field its drafter ignores is refused, so nothing is silently dropped)."""

    name: str = "oracle"
    noise: float = 0.0  # oracle: chance per drafted position that the true token is demoted or dropped
    seed: int = 0  # oracle: seeds the distractors and the demotions
    model: str | None = None  # dflash: the checkpoint directory

    def __post_init__(self) -> None:
        entry = REGISTRY.get(self.name)
        if entry is None:
            raise ConfigError(f"drafter={self.name!r} is unknown: expected one of {sorted(REGISTRY)}")
        stray = [f.name for f in dataclasses.fields(self)
                 if f.name not in ("name", *entry.fields) and getattr(self, f.name) != f.default]
        if stray:
            raise ConfigError(f"drafter {self.name!r} does not take {', '.join(stray)}; it takes "
                              f"{', '.join(entry.fields) or 'no settings'}")
        ok_noise = isinstance(self.noise, (int, float)) and not isinstance(self.noise, bool) and \
            math.isfinite(self.noise) and 0.0 <= self.noise <= 1.0
        if not ok_noise:
            raise ConfigError(f"noise={self.noise!r} is out of range: expected a probability in [0, 1]")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ConfigError(f"drafter seed={self.seed!r} is out of range: expected an integer >= 0")
        if "model" in entry.fields and not (isinstance(self.model, str) and self.model):
            raise ConfigError(f"drafter {self.name!r} needs a checkpoint directory (--drafter-model DIR)")

    def settings(self) -> dict:
        """The fields this drafter reads, with their values."""
        return {name: getattr(self, name) for name in REGISTRY[self.name].fields}

    def label(self) -> str:
        """A short human label: "oracle (noise 0.3, seed 1)", "dflash (models/x/dflash)"."""
        parts = ", ".join(f"{k} {v}" if k != "model" else str(v) for k, v in self.settings().items())
        return f"{self.name} ({parts})" if parts else self.name


@dataclass(frozen=True, slots=True)
class DrafterEntry:
    summary: str  # one sentence: what it proposes (CLI and sidebar help)
    fields: tuple[str, ...]  # the DrafterSpec fields it reads
    build: Callable[[DrafterSpec, DraftTarget], Drafter]


REGISTRY: dict[str, DrafterEntry] = {
    "oracle": DrafterEntry(oracle.SUMMARY, ("noise", "seed"), oracle.build),
    "dflash": DrafterEntry(dflash.SUMMARY, ("model",), dflash.build),
}


def build_drafter(spec: DrafterSpec, target: DraftTarget) -> Drafter:
    """A fresh drafter for one decode."""
    return REGISTRY[spec.name].build(spec, target)
