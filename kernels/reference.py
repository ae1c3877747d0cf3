"""Plain-torch references of the ddtree ops, written the simple way; for tests only.

They follow the contracts in kernels/ops.py and share no code with the C++ or CUDA kernels.
"""

from __future__ import annotations

import heapq
import math

import torch
from torch import Tensor


def tree_build(draft_logprobs: Tensor, root_token: Tensor, budget: int, budget_limit: Tensor | None = None
               ) -> tuple[Tensor, ...]:
    num_depths, vocab = draft_logprobs.shape
    k = min(budget, vocab)
    rows = draft_logprobs.tolist()
    candidates = [sorted(range(vocab), key=lambda t, row=row: (-row[t], t))[:k] for row in rows]

    def child_score(parent_score: Tensor, depth: int, rank: int) -> Tensor:  # float32, parent + lp
        return parent_score + draft_logprobs[depth - 1, candidates[depth - 1][rank]]

    root = int(root_token)
    tokens, parents, depths, ranks = [root], [-1], [0], [0]
    scores = [torch.tensor(0.0, dtype=torch.float32)]
    heap: list[tuple[float, int, int, int, Tensor]] = []  # (-score, depth, rank, parent, score)
    if k > 0:
        first = child_score(scores[0], 1, 0)
        heapq.heappush(heap, (-first.item(), 1, 0, 0, first))
    num_popped = budget if budget_limit is None else int(budget_limit)
    while heap and len(tokens) < num_popped + 1:
        _, depth, rank, parent, score = heapq.heappop(heap)
        node = len(tokens)
        tokens.append(candidates[depth - 1][rank])
        parents.append(parent)
        depths.append(depth)
        ranks.append(rank)
        scores.append(score)
        if rank + 1 < k:
            sibling = child_score(scores[parent], depth, rank + 1)
            heapq.heappush(heap, (-sibling.item(), depth, rank + 1, parent, sibling))
        if depth < num_depths:
            child = child_score(score, depth + 1, 0)
            heapq.heappush(heap, (-child.item(), depth + 1, 0, node, child))
    num_real = len(tokens)
    num_padding = budget + 1 - num_real
    tokens += [root] * num_padding
    parents += [-1] * num_padding
    depths += [0] * num_padding
    ranks += [0] * num_padding
    scores += [torch.tensor(float("-inf"))] * num_padding

    visibility = torch.zeros(budget + 1, budget + 1, dtype=torch.bool)
    for i in range(budget + 1):
        j = i
        while j != -1:
            visibility[i, j] = True
            j = parents[j]
    as_long = lambda xs: torch.tensor(xs, dtype=torch.int64)
    return as_long(tokens), as_long(parents), as_long(depths), as_long(ranks), torch.stack(scores), visibility


def verify_attn(
    q_lat: Tensor, q_pe: Tensor, ckv: Tensor, kpe: Tensor, prefix_len: Tensor, block_mask: Tensor, scale: float
) -> tuple[Tensor, Tensor]:
    """Dense float64 scores over all S rows, masked, softmaxed."""
    num_nodes = q_lat.shape[0]
    prefix = int(prefix_len)
    cache_rows = ckv.shape[0]
    lat = torch.einsum("nhr,sr->nhs", q_lat.double(), ckv.double())
    rope = torch.einsum("nhp,sp->nhs", q_pe.double(), kpe.double())
    scores = scale * (lat + rope)  # [N, H, S]
    visible = torch.zeros(num_nodes, cache_rows, dtype=torch.bool, device=ckv.device)
    visible[:, :prefix] = True
    visible[:, prefix : prefix + num_nodes] = block_mask
    scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [N, H]; -inf where nothing is visible
    probs = torch.exp(scores - lse[..., None]).nan_to_num(0.0)
    o_lat = torch.einsum("nhs,sr->nhr", probs, ckv.double())
    return o_lat.to(q_lat.dtype), lse.float()


def tree_accept(tokens: Tensor, parents: Tensor, target: Tensor, max_depth: int) -> tuple[Tensor, Tensor, Tensor]:
    tokens_l, parents_l, target_l = tokens.tolist(), parents.tolist(), target.tolist()
    visited = [0]
    while True:
        current = visited[-1]
        children = [c for c in range(len(tokens_l)) if parents_l[c] == current and tokens_l[c] == target_l[current]]
        if not children:
            break
        visited.append(children[0])
    path = torch.full((max_depth + 1,), -1, dtype=torch.int64)
    path[: len(visited)] = torch.tensor(visited)
    return path, torch.tensor(len(visited)), torch.tensor(target_l[visited[-1]])


def kv_compact(ckv: Tensor, kpe: Tensor, prefix_len: Tensor, path: Tensor) -> None:
    prefix = int(prefix_len)
    for i, node in enumerate(path.tolist()):
        if node == -1:
            break
        ckv[:, prefix + i] = ckv[:, prefix + node].clone()
        kpe[:, prefix + i] = kpe[:, prefix + node].clone()


def commit_path(target: Tensor, path: Tensor, path_len: Tensor, bonus: Tensor, generated: Tensor,
                num_generated: Tensor, root: Tensor, prefix_len: Tensor) -> None:
    start, length = int(num_generated), int(path_len)
    for i, node in enumerate(path.tolist()[:length]):
        if start + i < generated.shape[0]:
            generated[start + i] = target[node]
    num_generated.fill_(start + length)
    prefix_len.fill_(int(prefix_len) + length)
    root.fill_(int(bonus))


def _cells(depths: Tensor, ranks: Tensor, num_classes: int) -> tuple[list[int], list[int]]:
    return depths.tolist(), [min(r, num_classes - 1) for r in ranks.tolist()]


def budget_choose(
    scores: Tensor, parents: Tensor, depths: Tensor, ranks: Tensor, realised: Tensor, predicted: Tensor,
    buckets: Tensor, seconds: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    factor = (realised / predicted).log()
    factor[0] = 0
    rows, classes = _cells(depths, ranks, factor.shape[1])
    own = [factor[d, c] for d, c in zip(rows, classes, strict=True)]
    parents_l = parents.tolist()
    accept = []
    for i in range(len(parents_l)):
        path, j = torch.tensor(0.0), i
        while j != -1:
            path, j = path + own[j], parents_l[j]
        accept.append((scores[i] + path).exp().clamp(max=1.0))  # clamp keeps NaN
    expected = (torch.stack(accept).cumsum(0) - 1.0)[buckets]
    value = (1.0 + expected) / seconds
    values = value.tolist()
    numbers = [k for k, v in enumerate(values) if v == v]  # NaN != NaN
    chosen = min(numbers, key=lambda k: (-values[k], k)) if numbers else 0
    return torch.tensor(chosen), expected, value


def confidence_learn(
    realised: Tensor, predicted: Tensor, parents: Tensor, depths: Tensor, ranks: Tensor, scores: Tensor, path: Tensor
) -> None:
    on_path = {node for node in path.tolist() if node != -1}
    rows, classes = _cells(depths, ranks, realised.shape[1])
    for i, v in enumerate(parents.tolist()):
        d, c = rows[i], classes[i]
        if d == 0:
            continue
        if v >= 0 and v in on_path:
            predicted[d, c] += (scores[i] - scores[v]).exp()
        if i in on_path:
            realised[d, c] += 1.0


def linear_rows(x: Tensor, packed: Tensor, out_features: int, group_ends: Tensor | None = None) -> Tensor:
    """x [M, G, K] through each group's W_g in float64 (with group_ends: each row of x [M, 1, K] through its group's,
    rows past the last end zero), in x's dtype. W_g unpacked from either layout: the CPU's panels (column 16p + j of
    W_g^T is packed[g, p, :, j]) or CUDA's [G, N, K'] (K' >= K, the rest zero padding)."""
    if packed.dim() == 4:
        g, num_panels, k, panel = packed.shape
        weight = packed.double().permute(0, 1, 3, 2).reshape(g, num_panels * panel, k)[:, :out_features]
    else:
        weight = packed.double()[:, :out_features, :x.shape[2]]  # [G, N, K]
    if group_ends is None:
        return torch.einsum("mgk,gnk->mgn", x.double(), weight).to(x.dtype)
    ends = group_ends.long().cpu()
    group = torch.searchsorted(ends, torch.arange(x.shape[0]), right=True)  # row m's group: the first end above m
    out = torch.zeros(x.shape[0], 1, out_features, dtype=torch.float64)
    held = group < len(ends)
    rows = x[:, 0].double().cpu()
    out[held, 0] = torch.einsum("mk,mnk->mn", rows[held], weight.cpu()[group[held]])
    return out.to(x.device, x.dtype)


def rms_norm_rows(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """x * rsqrt(mean(x^2) + eps) * weight in float64, in x's dtype."""
    x64 = x.double()
    return (x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * weight.double()).to(x.dtype)


def add_rms_norm(x: Tensor, delta: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """The sum rounded to x's dtype, then rms_norm_rows of that sum."""
    total = (x.double() + delta.double()).to(x.dtype)
    return total, rms_norm_rows(total, weight, eps)


def silu_mul(gate_up: Tensor) -> Tensor:
    """silu(gate) in float64 rounded to the dtype, times up in float64, rounded."""
    gate, up = gate_up.double().chunk(2, dim=-1)
    return ((gate / (1 + torch.exp(-gate))).to(gate_up.dtype).double() * up).to(gate_up.dtype)


def router_logits(x: Tensor, weight: Tensor) -> Tensor:
    """x @ weight^T in float64 (the float32 op is within its rounding of this)."""
    return x.double() @ weight.double().T


def moe_route(logits: Tensor, bias: Tensor, top_k: int, num_groups: int, top_groups: int, softmax: bool,
              normalize: bool, scaling: float, counts: Tensor | None = None, real: Tensor | None = None
              ) -> tuple[Tensor, Tensor]:
    """One row at a time, Python sorts on (not NaN, value, -id) keys; the sums in float32 in the contract's order."""
    device, (num_rows, num_experts) = logits.device, logits.shape
    logits, bias = logits.cpu(), bias.cpu()
    per_group = num_experts // num_groups
    scores = logits.softmax(-1) if softmax else logits.sigmoid()
    idx = torch.empty(num_rows, top_k, dtype=torch.int64)
    weights = torch.empty(num_rows, top_k, dtype=torch.float32)

    def best(values: list[float], ids: list[int], take: int) -> list[int]:
        return sorted(ids, key=lambda e: (not math.isnan(values[e]), -values[e] if values[e] == values[e] else 0, e)
                      )[:take]

    for n in range(num_rows):
        choice = (scores[n] + bias).tolist()
        if num_groups > 1:
            group_score = []
            for g in range(num_groups):
                members = best(choice, list(range(g * per_group, (g + 1) * per_group)), min(2, per_group))
                total = torch.tensor(0.0)
                for e in members:
                    total = total + torch.tensor(choice[e])
                group_score.append(total.item())
            kept = set(best(group_score, list(range(num_groups)), top_groups))
            choice = [c if e // per_group in kept else -math.inf for e, c in enumerate(choice)]
        chosen = best(choice, list(range(num_experts)), top_k)
        w = scores[n, chosen]
        if normalize:
            total = torch.tensor(0.0)
            for value in w:
                total = total + value
            w = w / (total + 1e-20)
        idx[n], weights[n] = torch.tensor(chosen), w * scaling
    if counts is not None:
        rows = idx if real is None else idx[real.cpu()]
        counts += torch.bincount(rows.reshape(-1), minlength=num_experts).to(counts)
    return idx.to(device), weights.to(device)


def expert_rows(x: Tensor, idx: Tensor, num_experts: int) -> tuple[Tensor, Tensor, Tensor]:
    """The assignments in (expert, token, rank) order by a Python sort; id E (no expert here) last."""
    num_tokens, top_k = idx.shape
    assignments = sorted(range(num_tokens * top_k), key=lambda j: (int(idx.view(-1)[j]), j))
    slots = torch.empty(num_tokens * top_k, dtype=torch.int64)
    for place, j in enumerate(assignments):
        slots[j] = place
    rows = x[torch.tensor([j // top_k for j in assignments], dtype=torch.int64, device=x.device)]
    ends = torch.tensor([int((idx <= e).sum()) for e in range(num_experts)], dtype=torch.int32)
    return rows, slots.view(num_tokens, top_k).to(x.device), ends.to(x.device)


def expert_combine(out: Tensor, slots: Tensor, weights: Tensor, group_ends: Tensor) -> Tensor:
    """Each token's weighted sum of its rows in float64, the rows at or past group_ends[-1] left out."""
    held = (slots < int(group_ends[-1]))[..., None]
    rows = out.double()[slots.clamp(0, max(out.shape[0] - 1, 0))]  # [N, k, H]
    return torch.where(held, rows * weights.double()[..., None], 0.0).sum(1).to(out.dtype)



def cache_attn(q: Tensor, keys: Tensor, values: Tensor, num_visible: Tensor, scale: float) -> Tensor:
    """Every query head against its key/value head's first num_visible rows, one head at a time in float64."""
    visible = int(num_visible)
    groups = q.shape[1] // keys.shape[1]
    out = torch.empty(q.shape, dtype=torch.float64)
    for h in range(q.shape[1]):
        k, v = keys[:visible, h // groups].double().cpu(), values[:visible, h // groups].double().cpu()
        weights = torch.softmax(scale * q[:, h].double().cpu() @ k.T, dim=-1)  # [N, visible]
        out[:, h] = weights @ v
    return out.to(q.device, q.dtype)


def head_norm_rope(x: Tensor, weight: Tensor | None, cos: Tensor, sin: Tensor, eps: float,
                   interleave: bool = False) -> Tensor:
    """Each head's RMSNorm (none without a weight), then rotate-half RoPE (interleave: of the pairs (2j, 2j + 1)), in
    float64, in x's dtype."""
    u = x.double()
    if weight is not None:
        u = u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + eps) * weight.double()
    first, second = (u[..., 0::2], u[..., 1::2]) if interleave else u.chunk(2, dim=-1)
    c, s = cos.double()[:, None], sin.double()[:, None]
    return torch.cat([first * c - second * s, second * c + first * s], dim=-1).to(x.dtype)


def latent_write(kv: Tensor, weight: Tensor, cos: Tensor, sin: Tensor, eps: float, interleave: bool, ckv: Tensor,
                 kpe: Tensor, rows: Tensor) -> None:
    """The float64 norm of kv's first R columns and RoPE of its last P (the references above), in kv's dtype, copied to
    the cache rows."""
    lat_dim = ckv.shape[1]
    ckv.index_copy_(0, rows, rms_norm_rows(kv[:, :lat_dim], weight, eps))
    kpe.index_copy_(0, rows, head_norm_rope(kv[:, None, lat_dim:], None, cos, sin, 0.0, interleave)[:, 0])


def context_write(kv: Tensor, k_norm: Tensor, rope: Tensor, start: Tensor, eps: float, keys: Tensor,
                  values: Tensor) -> None:
    """The float64 norm and RoPE of each key head (head_norm_rope above), in kv's dtype, and the value heads as they
    are, copied to the cache rows start .. start + n - 1 of every layer."""
    num_layers, _, num_kv_heads, dim = keys.shape
    n, width = kv.shape[0], num_layers * num_kv_heads * dim
    positions = int(start) + torch.arange(n, device=kv.device)
    turned = head_norm_rope(kv[:, :width].reshape(n, -1, dim), k_norm, rope[0, positions], rope[1, positions], eps)
    shape = (n, num_layers, num_kv_heads, dim)
    keys.index_copy_(1, positions, turned.reshape(shape).transpose(0, 1))
    values.index_copy_(1, positions, kv[:, width:].reshape(shape).transpose(0, 1))
