"""The drafter seam: the lifecycle every drafter follows inside a decode, and what it is built against.

A drafter lives for one decode. After the prefill it sees the prompt (begin); each step it proposes
log-probabilities for the next L positions, each position independent of the others (propose); after the
verify it learns which nodes were accepted (commit), so it keeps their context and drops the rest. Every
method runs inside the no-sync decode step: it may launch device work but never read a device value on the
host, and its tensors keep static shapes, so a whole step with any drafter captures as one CUDA graph.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from engine.config import DecodeConfig
    from engine.model.target import TargetModel


class Drafter(Protocol):
    name: str
    hidden_layers: tuple[int, ...]  # target layers i whose outputs (hidden_states[i + 1]) it reads; () for none

    def begin(self, prompt: torch.Tensor, hidden: torch.Tensor | None) -> None:
        """After the prefill. prompt [n] int64 on the device; hidden [n, len(hidden_layers) * H], the target's
        hidden states of every prompt token (None when hidden_layers is empty)."""
        ...

    def propose(self, root: torch.Tensor, num_generated: torch.Tensor) -> torch.Tensor:
        """float32 log-probabilities [L, V] for the L positions after the root (a 0-dim int64 device tensor,
        the last committed token, not yet in the target's cache); num_generated is the 0-dim count of tokens
        generated so far, the root included."""
        ...

    def commit(self, path: torch.Tensor, path_len: torch.Tensor, hidden: torch.Tensor | None) -> None:
        """After the verify. path [P] int64, the accepted nodes (root first, -1 padded; P = L + 1 after a drafted
        step), path_len its 0-dim length; hidden [N, len(hidden_layers) * H] the target's hidden states of every
        verified node. The path's nodes are the tokens the target's cache gained since the last commit, in order:
        after draft-free AR steps (the auto budget's back-off) one commit tells of all of them, path = 0 .. P - 1
        over their hidden rows."""
        ...

    def describe(self) -> dict:
        """Name and settings, for records and reports (plain JSON values)."""
        ...


@dataclass(slots=True)
class DraftTarget:
    """What a drafter is built against: the target model, the prompt, the decode settings, and the target's
    own continuation of the prompt (computed only if a drafter asks: the oracle does)."""

    model: TargetModel
    prompt: list[int]
    cfg: DecodeConfig
    continuation: Callable[[int], list[int]]  # n -> the first n tokens the target generates after the prompt
