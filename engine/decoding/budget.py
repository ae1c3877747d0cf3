"""The lossless budget policy (`--budget auto`): which truncation of the step's best-first tree to verify.

tree_build numbers nodes in pop order and a parent always precedes its children, so the first b + 1 nodes of the
tree built at the largest budget are a valid tree for every b: choosing a budget is a truncation. The drafter's
marginals give node i the probability exp(score_i) that its path is accepted (siblings exclude each other), so the
expected number of accepted drafted tokens of the truncation at b is a prefix sum over the pop order. The policy
divides (1 + expected accepted) by the step's cost at b, measured per budget bucket (a calibration at start-up,
refreshed from the run's own steps), and verifies the best bucket, b = 0 (an AR step) included. The drafter's
over- or under-confidence is corrected per depth by the running ratio of realised to predicted acceptance.

Any tree is lossless: the policy changes how many tokens a step commits, never which.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

DEFAULT_MAX = 256
BUCKETS = (0, 4, 8, 16, 32, 64, 128, 256, 512, 1024)  # budgets with a captured step each; MAX is the last used
COST_SMOOTHING = 0.2  # the weight of a new step time in its bucket's running cost
PRIOR_WEIGHT = 2.0  # pseudo-steps behind each depth's confidence ratio before the run has evidence


def buckets_up_to(maximum: int) -> tuple[int, ...]:
    """The budget buckets the policy chooses among: BUCKETS below maximum, and maximum itself."""
    return tuple(sorted({b for b in BUCKETS if b < maximum} | {maximum}))


def expected_accepted(scores: torch.Tensor, depths: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """[B + 1] -> [B + 1]: entry b is the expected number of accepted drafted tokens when the first b + 1 nodes
    are verified. scores are the cumulative log-probabilities (node 0, the root, is never counted); factors [L + 1]
    are the per-depth confidence corrections. On the device, no host sync."""
    p = (scores.exp() * factors[depths]).clamp(max=1.0)
    p = torch.where(depths > 0, p, torch.zeros_like(p))
    return p.cumsum(0)


@dataclass
class Calibration:
    """Per depth d >= 1: realised / predicted acceptance of depth d over the run (how often the accepted path
    reached depth d, against the summed probability of the verified depth-d nodes), with a prior of ratio 1."""

    num_depths: int
    realised: list[float] = field(default_factory=list)
    predicted: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.realised:
            self.realised = [PRIOR_WEIGHT] * (self.num_depths + 1)
            self.predicted = [PRIOR_WEIGHT] * (self.num_depths + 1)

    def factors(self) -> list[float]:
        """The correction per depth (index 0, the root, is 1)."""
        return [1.0] + [r / p for r, p in zip(self.realised[1:], self.predicted[1:], strict=True)]

    def update(self, reach_predicted: list[float], accepted_depth: int) -> None:
        """reach_predicted[d]: the raw (uncorrected) summed probability of the verified nodes at depth d;
        accepted_depth: the depth the accepted path reached (its length minus one)."""
        for d in range(1, self.num_depths + 1):
            if reach_predicted[d] > 0:  # only depths the verified tree could reach are evidence
                self.predicted[d] += reach_predicted[d]
                self.realised[d] += 1.0 if accepted_depth >= d else 0.0


@dataclass
class CostTable:
    """The step's seconds at each bucket: measured at start-up, then a running mean of the run's own steps."""

    buckets: tuple[int, ...]
    seconds: list[float]

    def __post_init__(self) -> None:
        if len(self.seconds) != len(self.buckets) or not all(math.isfinite(s) and s > 0 for s in self.seconds):
            raise ValueError(f"a cost table needs one positive time per bucket {self.buckets}, got {self.seconds}")

    def observe(self, budget: int, seconds: float) -> None:
        i = self.buckets.index(budget)
        self.seconds[i] += COST_SMOOTHING * (seconds - self.seconds[i])


@dataclass(frozen=True)
class Choice:
    """One step's decision: the verified budget and the curves it was read from (per bucket)."""

    budget: int
    expected: tuple[float, ...]  # expected accepted drafted tokens at each bucket (corrected)
    cost_s: tuple[float, ...]  # predicted step seconds at each bucket
    value: tuple[float, ...]  # (1 + expected) / cost: tokens per second at each bucket


def choose(expected_at_buckets: list[float], table: CostTable) -> Choice:
    """The bucket with the most expected tokens per second; ties go to the smaller budget."""
    value = [(1.0 + e) / s for e, s in zip(expected_at_buckets, table.seconds, strict=True)]
    best = max(range(len(value)), key=lambda i: (value[i], -i))
    return Choice(table.buckets[best], tuple(expected_at_buckets), tuple(table.seconds), tuple(value))


def reach_by_depth(scores: torch.Tensor, depths: torch.Tensor, num_depths: int) -> torch.Tensor:
    """[L + 1]: the summed raw probability exp(score) of the given nodes at each depth (root excluded)."""
    reach = torch.zeros(num_depths + 1, dtype=scores.dtype, device=scores.device)
    reach.index_add_(0, depths, scores.exp())
    reach[0] = 0
    return reach
