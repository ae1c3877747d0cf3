"""The two trees a step can verify besides the best-first DDTree (the ddtree.tree_build op): the root alone
(AR) and a chain of the drafter's top-1 token per depth (DFlash's own verification). Both return the
tree_build op's outputs (tokens, parents, depths, ranks, scores, visibility) in plain torch on the device,
with static shapes and no host sync."""
from __future__ import annotations

import torch

Tree = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def root_tree(root: torch.Tensor) -> Tree:
    """A tree of one node, the root (0-dim int64): what AR verifies."""
    dev = root.device
    zero = torch.zeros(1, dtype=torch.int64, device=dev)
    return (root.view(1).clone(), torch.full((1,), -1, dtype=torch.int64, device=dev), zero, zero.clone(),
            torch.zeros(1, dtype=torch.float32, device=dev), torch.ones(1, 1, dtype=torch.bool, device=dev))


def chain_tree(draft_logprobs: torch.Tensor, root: torch.Tensor) -> Tree:
    """The root, then the top-1 token of each of the L drafted depths, each the child of the one before:
    L + 1 nodes. Ties pick the lower token id, as tree_build's rank 0 does."""
    num_depths = draft_logprobs.shape[0]
    dev = draft_logprobs.device
    best = draft_logprobs.argmax(dim=-1)  # [L]
    best_logprob = draft_logprobs.gather(1, best[:, None]).squeeze(1)
    tokens = torch.cat([root.view(1), best])
    steps = torch.arange(num_depths + 1, device=dev)
    scores = torch.cat([torch.zeros(1, device=dev), best_logprob.cumsum(0)])
    visibility = torch.ones(num_depths + 1, num_depths + 1, dtype=torch.bool, device=dev).tril()
    return tokens, steps - 1, steps, torch.zeros_like(steps), scores, visibility
