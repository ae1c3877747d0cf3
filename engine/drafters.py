"""Drafters: who proposes the next L tokens' log-probabilities, each position independent (a block drafter)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

NUM_CANDIDATES = 8  # tokens the oracle ranks explicitly: the truth plus seeded distractors
RANK_GAP = 1.0  # logit step between consecutive distractor ranks
TRUTH_MARGIN = 3.0  # logit lead of the undemoted true token over the best distractor
FLOOR = -12.0  # logit of every token outside the ranked candidates


class Drafter(Protocol):
    """propose() must not read device values on the host: it runs inside the no-sync decode step."""

    name: str

    def propose(self, generated: torch.Tensor, num_generated: torch.Tensor, num_positions: int) -> torch.Tensor:
        """generated [T] int64 (the committed generated tokens, valid up to num_generated, a 0-dim tensor);
        returns float32 log-probabilities [num_positions, V] for generated positions num_generated,
        num_generated + 1, ..."""
        ...

    def describe(self) -> dict:
        ...


class OracleDrafter:
    """Knows the greedy continuation and ranks it first, with seeded distractors below.

    noise is the chance, per drafted position, that the true token is demoted: half the time to a random
    lower rank among the candidates, half the time out of them (below every other token). Positions past
    the known continuation get distractors only. All draws are made up front per absolute position, so a
    proposal is one device gather: no host sync, and the same tree whatever the device.
    """

    name = "oracle"

    def __init__(self, continuation: Sequence[int], vocab_size: int, noise: float = 0.0, seed: int = 0,
                 num_positions: int | None = None, device: torch.device | str = "cpu") -> None:
        if not 0.0 <= noise <= 1.0:
            raise ValueError(f"noise={noise!r} is out of range: expected a probability in [0, 1]")
        if vocab_size < 2:
            raise ValueError(f"vocab_size={vocab_size} is too small for a drafter: need at least 2 tokens")
        truth = np.asarray(continuation, dtype=np.int64)
        if truth.size and (truth.min() < 0 or truth.max() >= vocab_size):
            raise ValueError(f"continuation has token ids outside [0, {vocab_size})")
        self.noise, self.seed, self.vocab_size = noise, seed, vocab_size
        rows = (num_positions or truth.size) + 1
        self.demoted = np.zeros(rows, dtype=bool)
        self.table = torch.from_numpy(self._build(truth, rows)).to(device)  # [rows, V] log-probs

    def _build(self, truth: np.ndarray, rows: int) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        v = self.vocab_size
        num_ranked = min(NUM_CANDIDATES, v)
        rank_logits = -TRUTH_MARGIN - RANK_GAP * np.arange(num_ranked - 1)  # distractors' logits by rank
        logits = np.full((rows, v), FLOOR, dtype=np.float64)
        for p in range(rows):
            known = p < truth.size
            pool = rng.permutation(v)
            if known:
                pool = pool[pool != truth[p]]
            logits[p, pool[: num_ranked - 1]] = rank_logits
            if not known:
                continue
            if rng.random() >= self.noise:
                logits[p, truth[p]] = 0.0
                continue
            self.demoted[p] = True
            if rng.random() < 0.5 and num_ranked > 1:  # demote to rank r among the candidates
                r = int(rng.integers(1, num_ranked))
                logits[p, truth[p]] = -TRUTH_MARGIN - RANK_GAP * (r - 1) - RANK_GAP / 2
            else:  # drop out of the candidates, below everything
                logits[p, truth[p]] = FLOOR - 1.0
        logits -= np.logaddexp.reduce(logits, axis=1, keepdims=True)
        return logits.astype(np.float32)

    def propose(self, generated: torch.Tensor, num_generated: torch.Tensor, num_positions: int) -> torch.Tensor:
        rows = (num_generated + torch.arange(num_positions, device=self.table.device)).clamp(
            max=self.table.shape[0] - 1)
        return self.table.index_select(0, rows)

    def describe(self) -> dict:
        return {"name": self.name, "noise": self.noise, "seed": self.seed}
