"""The two trees a step can verify besides the best-first DDTree (the ddtree.tree_build op): the root alone
(AR) and a chain of the drafter's top-1 token per depth (DFlash's own verification). Both return the
tree_build op's outputs (tokens, parents, depths, ranks, scores, visibility) in plain torch on the device,
with static shapes and no host sync."""
from __future__ import annotations

import torch

Tree = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


class RootTree:
    """The tree of one node, the root: what AR verifies. Its parents, depths, ranks, scores and visibility are the
    same every step, so they are made once; a step's tree copies only the root (0-dim int64), whose own buffer takes
    the next root when the step commits."""

    def __init__(self, device: torch.device) -> None:
        def int64(value: int) -> torch.Tensor:
            return torch.full((1,), value, dtype=torch.int64, device=device)
        self._rest = (int64(-1), int64(0), int64(0), torch.zeros(1, dtype=torch.float32, device=device),
                      torch.ones(1, 1, dtype=torch.bool, device=device))

    def __call__(self, root: torch.Tensor) -> Tree:
        return (root.view(1).clone(), *self._rest)


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
