"""The lossless budget policy (`--budget auto`): which truncation of the step's best-first tree to verify.

tree_build numbers nodes in pop order and a parent always precedes its children, so the first b + 1 nodes of the
tree built at the largest budget are a valid tree for every b: choosing a budget is a truncation. The drafter's
marginals give node i the probability exp(score_i) that its path is accepted (siblings exclude each other), so the
expected number of accepted drafted tokens of the truncation at b is a prefix sum over the pop order. The policy
divides (1 + expected accepted) by the step's cost at b, measured per budget bucket (a calibration at start-up,
refreshed from the run's own steps), and verifies the best bucket, b = 0 (an AR step) included. The drafter's
over- or under-confidence is corrected per depth and rank class by the running ratio of realised to predicted
acceptance (learn_confidence), kept on the device.

Any tree is lossless: the policy changes how many tokens a step commits, never which.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

COST_SMOOTHING = 0.2  # the weight of a new step time in its bucket's running cost
PRIOR_TRIALS = 1.0  # pseudo-trials of ratio 1 behind each confidence factor before the run has evidence
RANK_CLASSES = 2  # confidence is corrected apart for the drafter's top token at a depth (rank 0) and the others


def path_sums(values: torch.Tensor, parents: torch.Tensor, num_depths: int) -> torch.Tensor:
    """[N] -> [N]: each node's value plus its ancestors' (parents[0] = -1), by pointer jumping: log2(depth) rounds
    of vector ops, no host sync, no loop over nodes."""
    total, ancestor = values.clone(), parents.clone()
    for _ in range(max(num_depths, 1).bit_length()):
        has = ancestor >= 0
        safe = ancestor.clamp(min=0)
        total = total + torch.where(has, total[safe], torch.zeros_like(total))
        ancestor = torch.where(has, ancestor[safe], ancestor)
    return total


def expected_accepted(scores: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor, ranks: torch.Tensor,
                      log_factors: torch.Tensor) -> torch.Tensor:
    """[B + 1] -> [B + 1]: entry b is the expected number of accepted drafted tokens when the first b + 1 nodes are
    verified. A node's path is accepted with probability exp(score) (the drafter's marginals along it), corrected by
    log_factors [L + 1, RANK_CLASSES] for every node of the path at its depth and rank class, capped at 1. The root
    (node 0) is never counted. On the device, no host sync."""
    own = log_factors[depths, (ranks > 0).long()]
    own = torch.where(depths > 0, own, torch.zeros_like(own))
    p = (scores + path_sums(own, parents, log_factors.shape[0] - 1)).exp().clamp(max=1.0)
    return torch.where(depths > 0, p, torch.zeros_like(p)).cumsum(0)


def confidence_prior(num_depths: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(realised, predicted) [L + 1, RANK_CLASSES]: PRIOR_TRIALS of each at every depth and rank class."""
    prior = torch.full((num_depths + 1, RANK_CLASSES), PRIOR_TRIALS, device=device)
    return prior, prior.clone()


def log_confidence(realised: torch.Tensor, predicted: torch.Tensor) -> torch.Tensor:
    """[L + 1, RANK_CLASSES] log(realised / predicted), the root's row 0: what expected_accepted takes."""
    out = (realised / predicted).log()
    out[0] = 0
    return out


def learn_confidence(realised: torch.Tensor, predicted: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor,
                     ranks: torch.Tensor, scores: torch.Tensor, path: torch.Tensor, path_len: torch.Tensor) -> None:
    """Add one verified tree's evidence, in place and on the device (no host sync). At each depth d the accepted
    path reached d - 1 at node v = path[d - 1]; v's children are that depth's trial per rank class: the drafter
    predicts one of them is accepted with their summed conditional probability exp(score_child - score_v), and the
    run realises 1 for the class of the child the path took (path[d]), if any."""
    n = parents.shape[0]
    depth_index = (depths - 1).clamp(min=0, max=path.shape[0] - 1)
    parent = parents.clamp(min=0)
    under_path = (depths > 0) & (parents >= 0) & (depth_index < path_len) & (path[depth_index] == parents)
    taken = under_path & (depths < path_len) & (path[depths.clamp(max=path.shape[0] - 1)] == torch.arange(
        n, device=parents.device))
    cell = depths * RANK_CLASSES + (ranks > 0).long()
    conditional = (scores - scores[parent]).exp()
    predicted.view(-1).index_add_(0, cell, torch.where(under_path, conditional, torch.zeros_like(conditional)))
    realised.view(-1).index_add_(0, cell, taken.to(realised.dtype))


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
