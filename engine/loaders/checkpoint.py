"""A loaded model: its config, a source of its weights, and (for fixtures) a prompt with its golden continuation.

The weights are read when a model is built, through a WeightSource: `tensors(device, dtype)` yields them one at
a time, already on the device in that dtype (a Hugging Face directory is read tensor by tensor from its
safetensors, engine.loaders.hf_weights, so no float32 copy of the model is ever made on the host), and `numpy()` gives
float32 host arrays, which the numpy golden model and the .kdtr writer take (small models).
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from engine.config import ModelConfig

if TYPE_CHECKING:
    from engine.loaders.text import Tokenizer


class WeightSource(Protocol):
    def names(self) -> list[str]:
        """Every tensor's engine.model.weights name, in engine.model.weights order."""
        ...

    def tensors(self, device: str | torch.device, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor) for every tensor, each on device in dtype, one at a time in the order they are read."""
        ...

    def numpy(self) -> dict[str, np.ndarray]:
        """Every tensor as a float32 host array, in names() order."""
        ...


class ArrayWeights:
    """Weights held as float32 numpy arrays (.kdtr fixtures, generated models); numpy() returns them themselves."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.arrays = arrays

    def names(self) -> list[str]:
        return list(self.arrays)

    def tensors(self, device: str | torch.device, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
        for name, arr in self.arrays.items():
            yield name, torch.from_numpy(arr).to(device=device, dtype=dtype)

    def numpy(self) -> dict[str, np.ndarray]:
        return self.arrays


@dataclass(slots=True)
class Checkpoint:
    config: ModelConfig
    weights: WeightSource  # names and shapes per engine.model.weights; a dict of float32 arrays becomes ArrayWeights
    source: str  # the file or directory it came from
    prompt: np.ndarray | None = None  # [P] int64
    golden_tokens: np.ndarray | None = None  # [T] int64: greedy continuation of prompt per the golden model
    golden_logits: np.ndarray | None = None  # [T, V] float32: the logits each golden token is the argmax of
    tokenizer: Tokenizer | None = None  # a model directory's tokenizer.json (None: token ids only)
    prompt_texts: tuple[str, ...] = ()  # the model's own example prompts (prompts.json); prompt encodes the first

    def __post_init__(self) -> None:
        if isinstance(self.weights, dict):
            self.weights = ArrayWeights(self.weights)

    @property
    def has_golden(self) -> bool:
        return self.golden_tokens is not None

    def numpy_weights(self) -> dict[str, np.ndarray]:
        """Every weight as a float32 host array (read in full from a lazy source: meant for small models)."""
        return self.weights.numpy()
