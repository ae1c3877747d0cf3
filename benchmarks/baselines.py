"""What the kernels are measured against, and their random inputs (verify_attn's: one set, and the sets a timing
rotates through, with ours in both modes as every benchmark calls it).

torch_attention is the plain-torch absorbed attention verify_attn replaces; float64_attention the reference
both are checked against. heapq_tree_build is the usual way to build a DDTree draft tree without a kernel:
torch.topk per depth on the device, then a best-first loop over Python's heapq on the host. It follows the
ddtree.tree_build contract exactly (float32 cumulative scores, ties to lower depth, rank, parent), so its
trees can be compared with the op's, element for element.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np
import torch

from benchmarks.common import num_input_sets
from kernels import ops

# Kimi-K2 attention widths: heads, kv_lora_rank, qk_rope_head_dim; softmax scale = qk_head_dim ** -0.5
HEADS, RANK, ROPE = 64, 512, 64
SCALE = (128 + ROPE) ** -0.5


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


@dataclass(slots=True)
class AttnSet:
    """One verify_attn input set, and the [N, prefix + N] mask the torch baseline needs (made untimed)."""

    q_lat: torch.Tensor  # [N, H, R]
    q_pe: torch.Tensor  # [N, H, P]
    ckv: torch.Tensor  # [S, R]
    kpe: torch.Tensor  # [S, P]
    prefix_len: torch.Tensor  # 0-dim int64
    block_mask: torch.Tensor  # [N, N] bool: a random tree's visibility
    visible: torch.Tensor  # [N, prefix + N] bool
    prefix: int


def attn_set(n: int, s: int, dtype: torch.dtype, device: torch.device, rng: np.random.Generator) -> AttnSet:
    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device, dtype=dtype)

    prefix = s - n
    mask = torch.from_numpy(visibility_of(random_parents(n, rng))).to(device)
    visible = torch.cat([torch.ones(n, prefix, dtype=torch.bool, device=device), mask], dim=1)
    return AttnSet(randn(n, HEADS, RANK), randn(n, HEADS, ROPE), randn(s, RANK), randn(s, ROPE),
                   torch.tensor(prefix, device=device), mask, visible, prefix)


def masked_scores(a: AttnSet) -> torch.Tensor:
    """[N, H, prefix + N] scaled scores, -inf where the node does not see the row; float32 (float64 inputs:
    float64)."""
    rows = a.prefix + a.q_lat.shape[0]
    scores = torch.einsum("nhr,sr->nhs", a.q_lat, a.ckv[:rows]) + torch.einsum("nhp,sp->nhs", a.q_pe, a.kpe[:rows])
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32)) * SCALE
    return scores.masked_fill(~a.visible[:, None, :], float("-inf"))


def torch_attention(a: AttnSet) -> torch.Tensor:
    """The plain-torch absorbed attention verify_attn replaces: o_lat only (no lse), the leanest baseline."""
    probs = torch.softmax(masked_scores(a), dim=-1)
    return torch.einsum("nhs,sr->nhr", probs.to(a.ckv.dtype), a.ckv[: probs.shape[-1]])


def attn_cost(n: int, s: int, itemsize: int, num_visible_block: int) -> tuple[int, int]:
    """Fewest bytes (cache rows, q read once; o_lat, lse written once) and FLOPs (QK^T over R+P, PV over R)."""
    num_bytes = s * (RANK + ROPE) * itemsize + n * HEADS * (2 * RANK + ROPE) * itemsize + n * HEADS * 4 + n * n
    pairs = n * (s - n) + num_visible_block  # (node, row) pairs attended
    return num_bytes, 2 * HEADS * pairs * (RANK + ROPE) + 2 * HEADS * pairs * RANK


def attn_sets(n: int, s: int, dtype: torch.dtype, device: torch.device, rng: np.random.Generator) -> list[AttnSet]:
    """The input sets a timing of one shape rotates through (together past the L2s); the first is the checked one."""
    one = attn_set(n, s, dtype, device, rng)
    num_bytes, _ = attn_cost(n, s, dtype.itemsize, int(one.block_mask.sum()))
    return [one] + [attn_set(n, s, dtype, device, rng) for _ in range(num_input_sets(num_bytes) - 1)]


def ours_attention(a: AttnSet) -> tuple[torch.Tensor, torch.Tensor]:
    return ops.verify_attn(a.q_lat, a.q_pe, a.ckv, a.kpe, a.prefix_len, a.block_mask, SCALE)


def exact_attention(a: AttnSet) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch-invariant mode's kernel: keys reduced in position order, as the one-row AR call does."""
    return ops.verify_attn(a.q_lat, a.q_pe, a.ckv, a.kpe, a.prefix_len, a.block_mask, SCALE, batch_invariant=True)


def float64_attention(a: AttnSet) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference both are checked against, o_lat and lse, from float64 copies on the same device."""
    q_lat, q_pe, ckv, kpe = (x.double() for x in (a.q_lat, a.q_pe, a.ckv, a.kpe))
    scores = masked_scores(AttnSet(q_lat, q_pe, ckv, kpe, a.prefix_len, a.block_mask, a.visible, a.prefix))
    lse = torch.logsumexp(scores, dim=-1)  # [N, H]
    return torch.einsum("nhs,sr->nhr", torch.exp(scores - lse[..., None]), ckv[: scores.shape[-1]]), lse
