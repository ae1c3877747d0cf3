"""Block masks for the attention tests: causal, or the ancestor closure of a random tree."""
from __future__ import annotations

import random

import torch


def ancestor_mask(parents: list[int]) -> torch.Tensor:
    """[N, N] bool: row i is true at i and at every ancestor of i (parents precede children, root -1)."""
    mask = torch.eye(len(parents), dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            mask[i] |= mask[p]
    return mask


def block_mask(kind: str, num_nodes: int, rng: random.Random) -> torch.Tensor:
    """"causal", or "tree" (a random tree; with one node it is the single-token mask)."""
    if kind == "causal":
        return torch.ones(num_nodes, num_nodes, dtype=torch.bool).tril()
    return ancestor_mask([-1] + [rng.randrange(i) for i in range(1, num_nodes)])
