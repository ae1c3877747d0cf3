"""What the target and the drafter think of every node of a verified tree, read off the step's own tensors
(the verify logits, the draft): the numbers behind the Decode page's probabilities and each step's expected
acceptance.

The walk moves from a node to the child whose token the target picks there, so with p(i) the target's
probability of node i's token at its parent, node i lies on the accepted path with probability
P(i) = p(i) * P(parent) (P(root) = 1), and the expected number of accepted drafted tokens is the sum of P(i)
over the drafted nodes. The drafter's own guess of that number is the sum of its prefix probabilities
exp(score(i)). At temperature 0 the target's distribution is a point mass, so the expectation is the realised
length.
"""
from __future__ import annotations

import numpy as np
import torch

from engine.config import DecodeConfig
from engine.decoding.sampling import probabilities
from engine.records import NodeProbs


def node_probs(logits: torch.Tensor, tree: tuple[torch.Tensor, ...], draft: torch.Tensor | None,
               cfg: DecodeConfig) -> NodeProbs:
    """logits [N, V] (the verify's), tree as tree_build returns it, draft [L, V] log-probs (None for AR)."""
    tokens, parents, depths, _, scores, _ = tree
    real = parents >= 0
    at_parent = probabilities(logits, cfg)[parents.clamp(min=0), tokens]  # [N]
    target = torch.where(real, at_parent, torch.zeros_like(at_parent))
    target[0] = 1.0
    if draft is None:
        marginal = torch.ones_like(target)
    else:
        rows = (depths - 1).clamp(min=0)
        marginal = torch.where(real, draft[rows, tokens].exp(), torch.zeros_like(target))
        marginal[0] = 1.0
    p, parent, score = target.cpu().numpy().astype(np.float64), parents.cpu().numpy(), scores.cpu().numpy()
    on_path = np.zeros_like(p)
    move_on = np.zeros_like(p)
    on_path[0] = 1.0
    for i in range(1, len(p)):  # a parent precedes its children
        if parent[i] >= 0:
            on_path[i] = on_path[parent[i]] * p[i]
            move_on[parent[i]] += p[i]
    drafted = parent[1:] >= 0
    return NodeProbs(target=p.tolist(), draft=marginal.cpu().double().numpy().tolist(), move_on=move_on.tolist(),
                     expected_accepted=float(on_path[1:][drafted].sum()),
                     draft_expected=float(np.exp(score[1:][drafted].astype(np.float64)).sum()))
