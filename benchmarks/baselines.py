"""The Python baseline tree_build is measured against, and random trees for the kernel benchmarks.

heapq_tree_build is the usual way to build a DDTree draft tree without a kernel: torch.topk per depth on the
device, then a best-first loop over Python's heapq on the host. It follows the ddtree.tree_build contract
exactly (float32 cumulative scores, ties to lower depth, rank, parent), so its trees can be compared with the
op's, element for element.
"""
from __future__ import annotations

import heapq

import numpy as np
import torch


def visibility_of(parents: np.ndarray) -> np.ndarray:
    """[N, N] bool: row i true at i and at each ancestor of i (parents before children; -1 = no parent)."""
    n = len(parents)
    vis = np.zeros((n, n), dtype=bool)
    for i, p in enumerate(parents):
        if p >= 0:
            vis[i] = vis[p]
        vis[i, i] = True
    return vis


def random_parents(n: int, rng: np.random.Generator) -> np.ndarray:
    """A random tree of n nodes in topological order: node 0 is the root, node i's parent is in [0, i)."""
    return np.concatenate([[-1], (rng.random(n - 1) * np.arange(1, n)).astype(np.int64)])


def heapq_tree_build(draft_logprobs: torch.Tensor, root_token: int,
                     budget: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """tokens, parents, depths, ranks [B+1] int64, scores [B+1] float32, visibility [B+1, B+1] bool."""
    num_depths, vocab = draft_logprobs.shape
    k = min(budget, vocab)
    num_nodes = budget + 1
    tokens = np.full(num_nodes, root_token, dtype=np.int64)
    parents = np.full(num_nodes, -1, dtype=np.int64)
    depths = np.zeros(num_nodes, dtype=np.int64)
    ranks = np.zeros(num_nodes, dtype=np.int64)
    scores = np.full(num_nodes, -np.inf, dtype=np.float32)
    scores[0] = 0.0
    if k > 0:
        top = torch.topk(draft_logprobs, k, dim=-1)  # sorted: rank r of depth d is column r of row d - 1
        lp, ids = top.values.cpu().numpy(), top.indices.cpu().numpy()  # [L, K]
        heap = [(-(scores[0] + lp[0, 0]), 1, 0, 0)]  # (-score, depth, rank, parent): the tie-break order
        node = 1
        while heap and node < num_nodes:
            neg_score, depth, rank, parent = heapq.heappop(heap)
            tokens[node], parents[node], depths[node], ranks[node] = ids[depth - 1, rank], parent, depth, rank
            scores[node] = -neg_score
            if rank + 1 < k:  # next sibling
                heapq.heappush(heap, (-(scores[parent] + lp[depth - 1, rank + 1]), depth, rank + 1, parent))
            if depth < num_depths:  # first child
                heapq.heappush(heap, (-(scores[node] + lp[depth, 0]), depth + 1, 0, node))
            node += 1
    return tokens, parents, depths, ranks, scores, visibility_of(parents)
