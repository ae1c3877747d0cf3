"""The oracle drafter: knows the target's own continuation and ranks it first, with seeded distractors below."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from engine.drafters.base import DraftTarget
from engine.settings import Setting, check_fields, option

SUMMARY = ("Knows the target's continuation (the fixture's golden tokens, else an AR run of the prompt) and ranks "
           "it first at every depth, with seeded distractors below; noise demotes or drops it.")
NUM_CANDIDATES = 8  # tokens the oracle ranks explicitly: the truth plus seeded distractors
RANK_GAP = 1.0  # logit step between consecutive distractor ranks
TRUTH_MARGIN = 3.0  # logit lead of the undemoted true token over the best distractor
FLOOR = -12.0  # logit of every token outside the ranked candidates


@dataclass(frozen=True, slots=True)
class OracleSettings:
    noise: float = option(0.0, Setting(
        "chance, per drafted position, that the oracle demotes the true token (to a lower rank, or out of its "
        "candidates)", "Noise", "--noise", "slider", lo=0.0, hi=1.0, step=0.05))
    seed: int = option(0, Setting("seeds the oracle's distractors and demotions", "Seed", "--drafter-seed", lo=0,
                                  step=1))

    def __post_init__(self) -> None:
        check_fields(self)


class OracleDrafter:
    """noise is the chance, per drafted position, that the true token is demoted: half the time to a random
    lower rank among the candidates, half the time out of them (below every other token). Positions past the
    known continuation get distractors only. All draws are made up front per generated position, so a
    proposal is one device gather: no host sync, and the same tree whatever the device."""

    name = "oracle"
    hidden_layers: tuple[int, ...] = ()

    def __init__(self, continuation: Sequence[int], vocab_size: int, num_draft_positions: int, noise: float = 0.0,
                 seed: int = 0, num_positions: int | None = None, device: torch.device | str = "cpu") -> None:
        settings = OracleSettings(noise, seed)  # the one range check of noise and seed
        if vocab_size < 2:
            raise ValueError(f"vocab_size={vocab_size} is too small for a drafter: need at least 2 tokens")
        truth = np.asarray(continuation, dtype=np.int64)
        if truth.size and (truth.min() < 0 or truth.max() >= vocab_size):
            raise ValueError(f"continuation has token ids outside [0, {vocab_size})")
        self.noise, self.seed, self.vocab_size = settings.noise, settings.seed, vocab_size
        self.num_known = int(truth.size)
        rows = (num_positions or truth.size) + 1
        self.demoted = np.zeros(rows, dtype=bool)
        self.table = torch.from_numpy(self._build(truth, rows)).to(device)  # [rows, V] log-probs
        self.num_draft_positions = num_draft_positions  # L

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

    def begin(self, prompt: torch.Tensor, hidden: torch.Tensor | None) -> None:
        pass

    def propose(self, root: torch.Tensor, num_generated: torch.Tensor) -> torch.Tensor:
        rows = (num_generated + torch.arange(self.num_draft_positions, device=self.table.device)).clamp(
            max=self.table.shape[0] - 1)
        return self.table[rows]  # a vectorized row gather (index_select's few-index kernel took 2.8x the bytes)

    def commit(self, path: torch.Tensor, path_len: torch.Tensor, hidden: torch.Tensor | None) -> None:
        pass

    def describe(self) -> dict:
        return {"name": self.name, "noise": self.noise, "seed": self.seed, "known_tokens": self.num_known}


def build(settings: OracleSettings, target: DraftTarget) -> OracleDrafter:
    """The oracle knows every position a decode of target.cfg can draft at: max_new_tokens + block_size."""
    cfg, model = target.cfg, target.model
    num_positions = cfg.max_new_tokens + cfg.block_size
    return OracleDrafter(target.continuation(num_positions), model.cfg.vocab_size, cfg.num_draft_positions,
                         noise=settings.noise, seed=settings.seed, num_positions=num_positions, device=model.device)
