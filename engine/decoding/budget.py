"""The lossless budget policy (`--budget auto`): which truncation of the step's best-first tree to verify.

tree_build numbers nodes in pop order and a parent always precedes its children, so the first b + 1 nodes of the
tree built at the largest budget are a valid tree for every b: choosing a budget is a truncation. The drafter's
marginals give node i the probability exp(score_i) that its path is accepted (siblings exclude each other), so the
expected number of accepted drafted tokens of the truncation at b is a prefix sum over the pop order. The policy
divides (1 + expected accepted) by the step's cost at b, measured per budget bucket (a calibration at start-up,
brought to the run's level by its own steps: CostTable), and verifies the best bucket, b = 0 (an AR step) included.
The drafter's over- or under-confidence is corrected per depth and rank class by the running ratio of realised to
predicted acceptance (learn_confidence), kept on the device. The per-step arithmetic is two ops of the library
(kernels/ops.py: budget_choose, confidence_learn), one kernel each on CUDA.

Any tree is lossless: the policy changes how many tokens a step commits, never which.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from kernels import ops

COST_SMOOTHING = 0.2  # the weight of a step's time in its bucket's running excess (CostTable)
WEIGHT_DECAY = 0.05  # per step of a kind, the decay of its buckets' step counts: about the last 20 steps count
OWN_STEPS = 4.0  # a bucket's own excess counts half against its kind's once it has this many recent steps
OUTLIER_FACTOR = 2.0  # a step time above this many times its bucket's prediction is taken in at that bound
PRIOR_TRIALS = 1.0  # pseudo-trials of ratio 1 behind each confidence factor before the run has evidence
RANK_CLASSES = 2  # confidence is corrected apart for the drafter's top token at a depth (rank 0) and the others


def confidence_prior(num_depths: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(realised, predicted) [L + 1, RANK_CLASSES]: PRIOR_TRIALS of each at every depth and rank class."""
    prior = torch.full((num_depths + 1, RANK_CLASSES), PRIOR_TRIALS, device=device)
    return prior, prior.clone()


def log_confidence(realised: torch.Tensor, predicted: torch.Tensor) -> torch.Tensor:
    """[L + 1, RANK_CLASSES] log(realised / predicted), the root's row 0: the correction choose applies (the op
    computes it itself; this is the records' copy)."""
    out = (realised / predicted).log()
    out[0] = 0
    return out


def learn_confidence(realised: torch.Tensor, predicted: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor,
                     ranks: torch.Tensor, scores: torch.Tensor, path: torch.Tensor) -> None:
    """Add one verified tree's evidence, in place and on the device (ops.confidence_learn, one kernel). At each depth
    d the accepted path reached d - 1 at node v = path[d - 1]; v's children are that depth's trial per rank class:
    the drafter predicts one of them is accepted with their summed conditional probability exp(score_child -
    score_v), and the run realises 1 for the class of the child the path took (path[d]), if any. path is
    tree_accept's: the accepted nodes, then -1."""
    ops.confidence_learn(realised, predicted, parents, depths, ranks, scores, path)


@dataclass
class CostTable:
    """The step's seconds at each bucket: the calibration's shape, at the level of the run's own steps.

    The start-up calibration times, in one sitting, the part of a step that differs between buckets (the draft and
    the verify forward at each bucket; bucket 0, an AR step, the root's forward alone), so their differences are
    measured alike; a decode step adds its accept, commits and bookkeeping. Overwriting a bucket with the run's
    times would leave every bucket not chosen at the calibration's lower level, so that the buckets not chosen look
    cheap and the choice wanders. So each bucket keeps the running excess of its steps' times over its calibrated
    time, and a bucket is read at its calibrated time plus its kind's (AR step or drafted step) excess, the mean of
    its buckets' weighted by how often each ran lately, moved toward the bucket's own excess as it gathers steps."""

    buckets: tuple[int, ...]
    calibrated: list[float]  # start-up seconds per bucket
    excess: list[float] = field(default_factory=list)  # per bucket: running mean of (step time - calibrated)
    weights: list[float] = field(default_factory=list)  # per bucket: its steps lately (counts decaying by kind)

    def __post_init__(self) -> None:
        if len(self.calibrated) != len(self.buckets) or not all(math.isfinite(s) and s > 0 for s in self.calibrated):
            raise ValueError(f"a cost table needs one positive time per bucket {self.buckets}, got {self.calibrated}")
        self.excess = self.excess or [0.0] * len(self.buckets)
        self.weights = self.weights or [0.0] * len(self.buckets)

    def observe(self, budget: int, seconds: float) -> None:
        """Take in one step's time at the budget it verified (0: an AR step without a draft)."""
        if not (math.isfinite(seconds) and seconds > 0):
            return  # a broken timing must not poison the table
        i = self.buckets.index(budget)
        seconds = min(seconds, OUTLIER_FACTOR * self.predicted()[i])  # one stall moves it, a lasting change in steps
        excess = seconds - self.calibrated[i]
        self.excess[i] = excess if self.weights[i] == 0 else self.excess[i] + COST_SMOOTHING * (excess - self.excess[i])
        for j in self._kind(i):
            self.weights[j] *= 1.0 - WEIGHT_DECAY
        self.weights[i] += 1.0

    def offset(self, i: int) -> float:
        """Bucket i's kind's excess: its buckets' running excesses weighted by their recent steps (0 before any)."""
        kind = self._kind(i)
        total = sum(self.weights[j] for j in kind)
        return sum(self.weights[j] * self.excess[j] for j in kind) / total if total else 0.0

    def predicted(self) -> list[float]:
        """The step's seconds the policy reads at each bucket, made non-decreasing in the budget (a smaller tree's
        verify is part of a larger one's work) by the closest monotone fit (isotonic regression), floored at a
        microsecond."""
        raw = []
        for i, calibrated in enumerate(self.calibrated):
            offset, weight = self.offset(i), self.weights[i]
            raw.append(calibrated + offset + weight / (weight + OWN_STEPS) * (self.excess[i] - offset))
        return [max(s, 1e-6) for s in isotonic(raw)]

    def _kind(self, i: int) -> range:
        return range(0, 1) if self.buckets[i] == 0 else range(int(self.buckets[0] == 0), len(self.buckets))


def isotonic(values: list[float]) -> list[float]:
    """The non-decreasing sequence closest to values in least squares (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in values:
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, n2), (m1, n1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    return [m for m, n in blocks for _ in range(int(n))]


def choose(tree: Sequence[torch.Tensor], realised: torch.Tensor, predicted: torch.Tensor, buckets: torch.Tensor,
           seconds: torch.Tensor) -> ops.BucketChoice:
    """The bucket whose truncation of the tree (ops.tree_build's outputs) has the most expected tokens per second:
    (its index, 0-dim int64; the expected accepted drafted tokens at every bucket; (1 + expected) / seconds), on the
    device with no host sync, in one kernel (ops.budget_choose). Node i's path is accepted with probability
    exp(score_i) corrected by log_confidence(realised, predicted) at every node of the path (by depth and rank
    class), capped at 1; the expected accepted tokens at b are the sum over nodes 1..b. Ties go to the smaller
    budget."""
    _, parents, depths, ranks, scores, _ = tree
    return ops.budget_choose(scores, parents, depths, ranks, realised, predicted, buckets, seconds)
