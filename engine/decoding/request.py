"""What one measurement decodes: a checkpoint, a prompt, the decode settings, the drafter and the speculative modes
run beside AR. Checked once here, so everything downstream (session, profiling, reports, pages) takes it as given."""
from __future__ import annotations

from dataclasses import dataclass

from engine.config import DecodeConfig
from engine.decoding.decoder import DecodeError, check_positions, validate_prompt
from engine.drafters import DrafterSpec
from engine.loaders.checkpoint import Checkpoint
from engine.records import MODES

ORACLE = DrafterSpec()  # the default drafter
SPECULATIVE = tuple(m for m in MODES if m != "ar")  # the modes a request may ask for; AR always runs first


@dataclass(frozen=True, slots=True)
class DecodeRequest:
    """One decode of `prompt` by AR, then by each of `modes` with `drafter`, under `config`."""

    checkpoint: Checkpoint
    prompt: tuple[int, ...]
    config: DecodeConfig
    drafter: DrafterSpec = ORACLE
    modes: tuple[str, ...] = ("ddtree",)  # speculative modes, run in MODES order after AR

    def __post_init__(self) -> None:
        model = self.checkpoint.config
        object.__setattr__(self, "prompt", tuple(validate_prompt(self.prompt, model.vocab_size)))
        unknown = [m for m in self.modes if m not in SPECULATIVE]
        if unknown or not self.modes:
            raise DecodeError(f"modes={tuple(self.modes)!r}: expected one or more of {SPECULATIVE} beside AR "
                              "(which always runs first)")
        object.__setattr__(self, "modes", tuple(m for m in SPECULATIVE if m in self.modes))
        check_positions(len(self.prompt), self.config, model.max_position_embeddings)

    @property
    def primary(self) -> str:
        """The mode a stepped decode follows: DDTree when it runs, else the chain."""
        return self.modes[-1]
