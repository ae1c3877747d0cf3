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


def path_sums(values: torch.Tensor, visibility: torch.Tensor) -> torch.Tensor:
    """[N] -> [N]: each node's value plus its ancestors', as the tree's visibility mask (node i sees itself and its
    ancestors) times the values: one small matrix-vector product, no host sync, no loop over nodes."""
    return torch.mv(visibility.to(values.dtype), values)


def expected_accepted(scores: torch.Tensor, visibility: torch.Tensor, depths: torch.Tensor, ranks: torch.Tensor,
                      log_factors: torch.Tensor) -> torch.Tensor:
    """[B + 1] -> [B + 1]: entry b is the expected number of accepted drafted tokens when the first b + 1 nodes are
    verified. A node's path is accepted with probability exp(score) (the drafter's marginals along it), corrected by
    log_factors [L + 1, RANK_CLASSES] (row 0, the root's, all 0: log_confidence's) for every node of the path at its
    depth and rank class, capped at 1. The root (node 0, probability 1) is not counted. On the device, no host
    sync."""
    own = log_factors[depths, (ranks > 0).long()]
    p = (scores + path_sums(own, visibility)).exp().clamp(max=1.0)  # padding nodes: score -inf, p = 0
    return p.cumsum(0) - 1.0


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
                     ranks: torch.Tensor, scores: torch.Tensor, path: torch.Tensor) -> None:
    """Add one verified tree's evidence, in place and on the device (no host sync). At each depth d the accepted
    path reached d - 1 at node v = path[d - 1]; v's children are that depth's trial per rank class: the drafter
    predicts one of them is accepted with their summed conditional probability exp(score_child - score_v), and the
    run realises 1 for the class of the child the path took (path[d]), if any. path is tree_accept's: the accepted
    nodes, then -1."""
    nodes = torch.arange(parents.shape[0], device=parents.device)
    on_path = (nodes[:, None] == path[None, :]).any(1)  # [N] (path's -1 padding matches no node)
    parent = parents.clamp(min=0)
    under_path = on_path[parent] & (parents >= 0)  # the node's parent is on the path
    taken = on_path & (depths > 0)
    cell = depths * RANK_CLASSES + (ranks > 0).long()
    conditional = (scores - scores[parent]).exp()
    predicted.view(-1).index_add_(0, cell, conditional * under_path)
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

    def predicted(self) -> list[float]:
        """The step's seconds the policy reads at each bucket: a smaller tree costs at most what a larger one does
        (its verify is a subset of the work), so a bucket's time is capped by every larger bucket's. A bucket whose
        running time is high from one slow step is then not kept from being chosen again."""
        out = list(self.seconds)
        for i in range(len(out) - 2, -1, -1):
            out[i] = min(out[i], out[i + 1])
        return out


def choose(expected_at_buckets: torch.Tensor, seconds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the index of the bucket with the most expected tokens per second as a 0-dim int64, and those tokens per
    second (1 + expected) / seconds at every bucket), on the tensors' device with no host sync. Ties go to the
    smaller budget (argmax takes the first maximum)."""
    value = (1.0 + expected_at_buckets) / seconds
    return value.argmax(), value
