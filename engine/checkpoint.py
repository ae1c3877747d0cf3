"""A loaded model: config, weights, and (for fixtures) a prompt with its golden continuation."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import ModelConfig


@dataclass(slots=True)
class Checkpoint:
    config: ModelConfig
    weights: dict[str, np.ndarray]  # checkpoint name -> float32 array, names and shapes per engine.weights
    source: str  # the file or directory it came from
    prompt: np.ndarray | None = None  # [P] int64
    golden_tokens: np.ndarray | None = None  # [T] int64: greedy continuation of prompt per the golden model
    golden_logits: np.ndarray | None = None  # [T, V] float32: the logits each golden token is the argmax of

    @property
    def has_golden(self) -> bool:
        return self.golden_tokens is not None
