"""Typed wrappers over torch.ops.ddtree.* and their fake (meta) kernels.

The op library is built and loaded on the first op call (kernels.load()), not at import, so importing the
engine costs nothing until it decodes; the fake kernels are registered right after the load (they need the
schemas), or at import when the library is already loaded (torch imports this module for fake tracing).

Contracts (the one place in code where they are written; README.md, "Custom ops", has the long form).
Index scalars (root_token, prefix_len, path_len, bonus, num_generated, root) are 0-dim int64 tensors on the op's
device.

tree_build(draft_logprobs [L, V] f32, root_token, budget B in 0..1024, budget_limit=None)
    -> tokens, parents, depths, ranks [B+1] i64, scores [B+1] f32, visibility [B+1, B+1] bool.
  K = min(B, V) candidates per depth: the top K of row d-1 by (logprob desc, token asc), rank = index there.
  Best-first from the root's first child; a max-heap on float32 cumulative score (parent + lp), ties to lower
  depth, then rank, then parent index. Each pop adds a node and pushes its next sibling (rank+1 < K) and
  first child (depth < L). Node 0 = root (parent -1, score 0); nodes after the heap empties are padding
  (token root_token, parent -1, depth 0, rank 0, score -inf). visibility[i, j] iff j == i or j is an
  ancestor of i. NaN in draft_logprobs is an error. budget_limit (an index scalar in [0, B]; CUDA clamps it)
  stops the heap after that many pops, the rest padding: the first budget_limit + 1 nodes are tree_build's at
  budget budget_limit (the first n pops never reach rank n, so K = min(B, V) changes none of them), and the
  outputs keep B's shapes, so a captured graph can take a limit chosen afresh on the device every step.
verify_attn(q_lat [N, H, R], q_pe [N, H, P], ckv [S, R], kpe [S, P], prefix_len, block_mask [N, N] bool, scale,
            batch_invariant=False) -> o_lat [N, H, R] (input dtype), lse [N, H] f32.
  Node i sees cache rows u < prefix_len and rows prefix_len + j where block_mask[i, j] (prefix_len + N <= S).
  score = scale * (q_lat . ckv[u] + q_pe . kpe[u]); o_lat = softmax-weighted sum of ckv rows; lse = log of
  the sum of exp(score). All inputs float32 or all bfloat16; float32 accumulation. A node that sees no row
  gets o_lat = 0 and lse = -inf. batch_invariant: each (node, head) is reduced over its logical sequence
  alone, the prefix rows then its block rows in index order (for a tree node: the keys AR sees at its
  position, in position order), cut into tiles and splits at fixed positions and combined in position order,
  so its result is the same bits whatever N, the rows' cache slots and the work's spread over threads or
  blocks: a tree node's is AR's. On the CPU every call is (csrc/cpu/verify_attn_tile.h: one kernel for both
  modes, at no cost); on CUDA bfloat16 R = 512, P = 64 on sm_90a it is a tensor-core kernel
  (csrc/cuda/verify_attn_exact_wgmma.cuh, 1.2-1.8x the fast one), elsewhere a CUDA-core one
  (csrc/cuda/verify_attn_exact.cuh, much slower).
tree_accept(tokens [N], parents [N], target [N] i64, max_depth) -> path [max_depth+1] i64, path_len, bonus.
  From node 0, move to the child c with tokens[c] == target[current] while there is one; path lists the
  visited nodes root first, padded with -1; bonus = target[last visited].
kv_compact(ckv [num_layers, S, R], kpe [num_layers, S, P], prefix_len, path) -> None, in place.
  For each i before the first -1 in path: row prefix_len + path[i] -> row prefix_len + i in every layer.
commit_path(target [N] i64, path [P] i64, path_len, bonus, generated [G] i64 contiguous, num_generated, root,
            prefix_len) -> None, generated, num_generated, root and prefix_len in place.
  A step's commit in one launch (no host sync: a CUDA graph can hold it). With n = num_generated and L = path_len as
  passed: generated[n + i] = target[path[i]] for i < L (a slot at or past G is dropped), then num_generated = n + L,
  prefix_len += L, root = bonus. path and path_len are tree_accept's; target and path at any stride.

The budget policy's two ops (`--budget auto`) read a tree as tree_build returns it (scores [N] f32; parents, depths,
ranks [N] i64) and the confidence tables realised, predicted [L + 1, C] f32 (a row per depth, a column per rank
class; entries > 0, not checked: a 0 makes factors infinite or NaN). Node i's class is c_i = min(ranks[i], C - 1),
its cell (depths[i], c_i). Each is one kernel launch (one block) on CUDA, for N <= 1025.
budget_choose(scores, parents, depths, ranks, realised, predicted, buckets [K] i64, seconds [K] f32)
    -> chosen (0-dim i64), expected [K] f32, value [K] f32.
  factor[d, c] = log(realised[d, c] / predicted[d, c]) for d >= 1, factor[0, :] = 0; own_i = factor at i's cell.
  s_i = scores[i] + the sum of own_j over j = i and every ancestor of i; p_i = min(exp(s_i), 1) (NaN stays NaN;
  padding, score -inf: 0). expected[k] = p_0 + ... + p_b - 1 at b = buckets[k] (budgets in [0, N - 1]); value[k] =
  (1 + expected[k]) / seconds[k] (the step's predicted seconds at bucket k, > 0); chosen = the k of the largest
  value, the smallest k on ties, never a NaN value's (0 if every value is NaN).
confidence_learn(realised, predicted, parents, depths, ranks, scores, path [M] i64) -> None, realised and predicted
            in place.
  path is tree_accept's (the accepted nodes, then -1). For every node i with depths[i] > 0 and parent v: if v >= 0
  is on the path, predicted[cell_i] += exp(scores[i] - scores[v]); if i is on the path, realised[cell_i] += 1.
  On CUDA the float sums are added with atomics, in an order that is not fixed.

linear_rows(x [M, G, K], packed, out_features N, group_ends=None) -> out [M, G, N] in x's dtype.
  out[:, g] = x[:, g] W_g^T for the [G, N, K] weights W that pack_linear_rows(W) packed for x's device; with
  group_ends (int32 [G], non-decreasing, <= M) x is [M, 1, K] and row m goes through the one W_g with
  group_ends[g - 1] <= m < group_ends[g] (rows past the last end: zeros), the routed experts over their sorted rows.
  x's rows and groups may have any strides, its K is contiguous. Every output is reduced in an order fixed by its
  row, W and the device alone, so a row's result is the same bits whatever M and the other rows are (torch's
  kernels change their reduction with M): the batch-invariant mode's matmul.
  CPU: float32; packed [G, ceil(N / 16), K, 16] (panels of LINEAR_ROWS_PANEL columns, zero-padded); every output
  one float32 chain over k = 0 .. K - 1 in order from 0 (each multiply-add fused or not as the compiler builds it,
  alike for every row count). CUDA: bfloat16 or float32; packed [G, N, K'] in x's dtype (bfloat16: K' = K rounded up
  to 8, zero-padded); bfloat16 runs tensor-core MMAs (wgmma on sm_90a, each row a column of the instruction;
  mma.sync tiles of 16 rows elsewhere), fp32 sums over K cut at positions fixed by W's shape and the GPU (never
  with group_ends; csrc/cuda/linear_rows.cuh), added in order and rounded once; float32 a warp's 32 strided chains
  folded by a fixed butterfly. A row's bits may differ between the devices, never between calls on one.

rms_norm_rows(x [M, D], weight [D], eps) -> y [M, D] (x's dtype).
  y = x * rsqrt(mean(x^2) + eps) * weight in float32, rounded once; x float32 or bfloat16 with contiguous rows,
  weight x's dtype or float32. Every row's sum of squares is reduced in an order fixed by D alone (the CPU: one
  chain in column order; CUDA: a block per row, 256 chains (of 16-byte vectors where D allows) folded by a fixed
  tree), so a row's bits are the same whatever M: the batch-invariant mode's norm, one launch (on CUDA every
  mode's: engine/model/layers.py rms_norm).
add_rms_norm(x [M, D], delta [M, D], weight [D], eps) -> sum [M, D], y [M, D] (x's dtype).
  The residual add and the norm after it, one launch: sum = x + delta, each element in float32 rounded once (torch's
  add), and y = rms_norm_rows(sum, weight, eps), the same bits (the kernels share the row's code). x and delta alike
  in dtype and shape, rows contiguous at any stride; weight as rms_norm_rows takes it.
silu_mul(gate_up [M, 2I]) -> out [M, I] (gate_up's dtype).
  SwiGLU's activation, one launch: with gate, up the two halves of a row, out = silu(gate) * up, where silu(g) =
  g / (1 + e^-g) in float32 is rounded to the dtype before the product, which is rounded again (on CUDA the bits of
  torch's F.silu(gate) * up; on the CPU within an ulp of them, by its own exp). Each element alone, so batch-invariant.
  Rows contiguous at any stride (a fused gate/up projection's output goes in as it is).
router_logits(x [N, H], weight [E, H] f32) -> logits [N, E] f32.
  The MoE router's logits x @ weight^T, x float32 or bfloat16 (rows contiguous at any stride; no float32 copy of it),
  weight float32 contiguous. Each logit is reduced in an order fixed by H alone (csrc/router_order.h): chain l of 32
  sums x[h] * w[h] in float32 with fused multiply-adds over its 4-column chunks h = 4c .. 4c + 3, c = l, l + 32, ...
  (where H is a multiple of 4; else its columns h = l, l + 32, ...), then for o = 16, 8, 4, 2, 1 every chain s_l
  becomes s_l + s_(l xor o) and the logit is s_0. So a row's logits have the same bits whatever N (batch-invariant),
  and the CPU and CUDA kernels the same bits as each other (the CUDA kernel's chains are a warp's lanes).
moe_route(logits [N, E] f32, bias [E] f32, top_k, num_groups G, top_groups, softmax, normalize, scaling, counts=None,
          real=None) -> idx [N, k] i64, weights [N, k] f32.
  DeepSeek-V3 routing of each row alone, E in 1..8191: scores = sigmoid(logits) (softmax: over the row, its sum in
  column order); choice = scores + bias (the bias steers selection only). With G > 1 the experts are G groups of E / G
  consecutive ids, a group's score the sum of its best min(2, E / G) choices (best first), and every expert outside
  the row's top_groups best groups gets a choice of -inf. idx = the top_k experts by choice, best first; "best" is the
  one total order used throughout: larger first, NaN above every number, ties to the lower id, so idx is unique.
  weights[n, r] = scores[n, idx[n, r]], with normalize divided by (their sum in rank order + 1e-20), times scaling.
  counts [E] i32 (optional, in place): += 1 for every chosen id of a row (of a row with real[n], real [N] bool, when
  given). 1 <= top_k <= top_groups * E / G. A row's bits depend on that row alone (both modes route through it).
expert_rows(x [N, H], idx [N, k] i64, num_experts E in 1..8191) -> rows [N k, H] (x's dtype), slots [N, k] i64,
            group_ends [E] i32.
  The routed rows grouped by expert: assignment (n, r) (expert idx[n, r]) gets row slots[n, r] of rows, a copy of
  x[n]; rows are in expert order, one expert's in token order (n, then r), and an id of E (no expert here: another
  rank's) after every expert's. group_ends[e] = the assignments with an id <= e (linear_rows' and
  torch._grouped_mm's group ends). x float32 or bfloat16 with contiguous rows. On the CPU an id outside [0, E]
  raises; on CUDA it counts as E. CUDA: a one-block counting sort (stable: one warp places the assignments in order),
  then a copy of the rows: two launches.
expert_combine(out [M, H], slots [N, k] i64, weights [N, k] f32, group_ends [E] i32) -> y [N, H] (out's dtype).
  y[n] = sum over r of weights[n, r] * out[slots[n, r]], in float32 with r in order, rounded once; an r whose slot is
  at or past group_ends[E - 1] (an assignment to no expert here, whose row was never computed) adds nothing. A
  token's result depends on its own rows alone (the batch-invariant mode takes it as it is). On the CPU a negative
  slot or a group_ends[E - 1] outside [0, M] raises; CUDA skips slots outside [0, min(M, group_ends[E - 1])).

cache_attn(q [N, Hq, D], keys [S, Hkv, D], values [S, Hkv, D], num_visible, scale) -> out [N, Hq, D] (q's dtype).
  Grouped-query attention over a cache's valid rows, the DFlash drafter's: query head h reads key/value head
  h // (Hq / Hkv); every node sees cache rows u < num_visible (num_visible in [1, S]) and no other, with
  score = scale * q[n, h] . keys[u, h // G] and out = the softmax-weighted sum of values[u, h // G]. keys and
  values contiguous, q's heads contiguous (its nodes at any stride), float32 or bfloat16 alike; out contiguous.
  CUDA bfloat16 with D in {32, 64, 128} on sm_80+: a tensor-core kernel, the valid rows split into chunks over the
  grid and the chunks merged in float32 (csrc/cuda/cache_attn.cuh); everything else, and the CPU: torch's
  scaled_dot_product_attention with a mask built from num_visible on the device (csrc/cache_attn_torch.h). A
  captured CUDA graph serves every num_visible; CUDA clamps it into [1, S].
head_norm_rope(x [M, H, D], weight [H, D] or None, cos [M, D/2] f32, sin [M, D/2] f32, eps, interleave=False)
               -> y [M, H, D] contiguous (x's dtype).
  Each head's RMSNorm (none when weight is None), then its rotate-half RoPE, in float32, rounded once:
  u = x * rsqrt(mean(x^2) + eps) * weight[h] (or x); pair j is (a, b) = (u[j], u[j + D/2]), or with interleave
  (u[2j], u[2j + 1]); y[j] = a cos[m, j] - b sin[m, j], y[j + D/2] = b cos[m, j] + a sin[m, j] (the interleaved
  layout lands in evens-then-odds order, as transformers permutes it). x float32 or bfloat16, each head's D values
  contiguous, rows and heads at any stride (a slice of a fused projection's output goes in as it is), D even and at
  most 512; weight x's dtype or float32. The DFlash drafter's q_norm / k_norm and RoPE, and the target's RoPE of
  q_pe and k_pe, one launch each (CUDA: a warp per head).
latent_write(kv [N, R + P], weight [R], cos [N, P/2] f32, sin [N, P/2] f32, eps, interleave, ckv [S, R], kpe [S, P],
             rows [N] i64) -> None, ckv and kpe in place.
  An absorbed-MLA layer's latent cache write in one launch: ckv[rows[i]] = rms_norm_rows(kv[i, :R], weight, eps) and
  kpe[rows[i]] = head_norm_rope(kv[i, R:] as one head, None, cos[i], sin[i], 0, interleave), the same bits as those
  two ops on the same device (the kernels share their per-row code), where the two ops and two index_copy_ took four
  launches. kv float32 or bfloat16, its rows at any stride and its last dim contiguous (the c_kv | k_pe columns of the
  fused projection go in as they are); weight kv's dtype or float32; ckv and kpe contiguous in kv's dtype (one layer's
  cache); R >= 1, P even and at most 512; rows at any stride, distinct (of a repeated row one write lands, unordered).
  No host sync (CUDA: a block per row, as rms_norm_rows), so a captured graph serves every prefix_len.
context_write(kv [n, 2 G D], k_norm [G, D], rope [2, P, D/2] f32, start (0-dim i64), eps, keys [layers, S, Hkv, D],
              values [layers, S, Hkv, D]) -> None, keys and values in place.
  The DFlash drafter's context cache write in one launch: n rows of every layer's stacked key and value projections
  (G = layers * Hkv heads of D; the keys' G D columns, then the values') go to the cache rows start .. start + n - 1.
  Row i's key head g (layer g // Hkv, head g % Hkv) is head_norm_rope(kv[i, g D : (g + 1) D] as one head, k_norm[g],
  rope[0, start + i], rope[1, start + i], eps) (rotate-half), its value head kv[i, G D + g D : G D + (g + 1) D] as it
  is: the same bits as head_norm_rope, a gather of the angles and two index_copy_ on the same device, where those
  took five launches with the positions' add. kv float32 or bfloat16, its rows at any stride and its last dim
  contiguous; k_norm kv's dtype or float32; rope (cos, then sin, of positions 0 .. P - 1) contiguous; keys and values
  contiguous in kv's dtype; D even and at most 512. start is read on the device, so a captured graph serves every
  length; the positions start .. start + n - 1 must be cache rows (< S) with angles (< P).

Value checks (NaN in the draft or the scores, prefix_len + N <= S, a well-formed path, parents before children,
depths below L + 1, ranks >= 0, buckets in [0, N - 1], finite seconds > 0, path_len in [1, P] and num_generated
>= 0) raise on the CPU. The CUDA ops cannot raise on values without a host sync, so there NaN ranks like -inf,
prefix_len is clamped into [0, S - N], malformed path entries are skipped and tree_accept stops when the path is
full; commit_path clamps path_len into [0, P] and writes no slot outside [0, G); latent_write skips a row whose
cache row is outside [0, S) (the CPU raises before writing any), and context_write one whose position is outside
[0, min(S, P)); in the budget ops a parent not in [-1, i) counts as
-1, a node at a depth outside [0, L + 1) has no cell (own 0, learns nothing), a negative rank is class 0, a bucket
is clamped into [0, N - 1], a NaN score's p is NaN and seconds divide as IEEE floats do. The engine checks the
step's results when it reads its record.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
from torch import Tensor

import kernels


class BuiltTree(NamedTuple):
    tokens: Tensor  # [B+1] int64
    parents: Tensor  # [B+1] int64
    depths: Tensor  # [B+1] int64
    ranks: Tensor  # [B+1] int64
    scores: Tensor  # [B+1] float32
    visibility: Tensor  # [B+1, B+1] bool


class Attention(NamedTuple):
    o_lat: Tensor  # [N, H, R]
    lse: Tensor  # [N, H] float32


class Acceptance(NamedTuple):
    path: Tensor  # [max_depth+1] int64, padded with -1
    path_len: Tensor  # 0-dim int64
    bonus: Tensor  # 0-dim int64


class BucketChoice(NamedTuple):
    chosen: Tensor  # 0-dim int64: the index into buckets
    expected: Tensor  # [K] float32: expected accepted drafted tokens at each bucket
    value: Tensor  # [K] float32: (1 + expected) / seconds


def tree_build(draft_logprobs: Tensor, root_token: Tensor, budget: int, budget_limit: Tensor | None = None
               ) -> BuiltTree:
    """Best-first draft tree of budget+1 nodes (root first) from per-depth draft log-probabilities; with a
    budget_limit, only that many nodes past the root are built and the rest is padding."""
    return BuiltTree(*_ops().tree_build(draft_logprobs, root_token, budget, budget_limit))


def verify_attn(
    q_lat: Tensor, q_pe: Tensor, ckv: Tensor, kpe: Tensor, prefix_len: Tensor, block_mask: Tensor, scale: float,
    batch_invariant: bool = False,
) -> Attention:
    """Absorbed-MLA attention of N block nodes over the prefix and the block rows their mask allows."""
    return Attention(*_ops().verify_attn(q_lat, q_pe, ckv, kpe, prefix_len, block_mask, scale, batch_invariant))


def tree_accept(tokens: Tensor, parents: Tensor, target: Tensor, max_depth: int) -> Acceptance:
    """Greedy walk from the root along children whose token is the target's choice at their parent."""
    return Acceptance(*_ops().tree_accept(tokens, parents, target, max_depth))


def kv_compact(ckv: Tensor, kpe: Tensor, prefix_len: Tensor, path: Tensor) -> None:
    """Move the accepted path's cache rows to prefix_len, prefix_len+1, ... in every layer (in place)."""
    _ops().kv_compact(ckv, kpe, prefix_len, path)


def commit_path(target: Tensor, path: Tensor, path_len: Tensor, bonus: Tensor, generated: Tensor,
                num_generated: Tensor, root: Tensor, prefix_len: Tensor) -> None:
    """Append the accepted path's target tokens to generated, move num_generated and prefix_len on, root = bonus."""
    _ops().commit_path(target, path, path_len, bonus, generated, num_generated, root, prefix_len)


def budget_choose(
    scores: Tensor, parents: Tensor, depths: Tensor, ranks: Tensor, realised: Tensor, predicted: Tensor,
    buckets: Tensor, seconds: Tensor,
) -> BucketChoice:
    """The bucket whose truncation of the tree has the most expected tokens per second, after the confidence
    correction; on the tensors' device with no host sync."""
    return BucketChoice(*_ops().budget_choose(scores, parents, depths, ranks, realised, predicted, buckets, seconds))


def confidence_learn(
    realised: Tensor, predicted: Tensor, parents: Tensor, depths: Tensor, ranks: Tensor, scores: Tensor, path: Tensor
) -> None:
    """Add one verified tree's realised and predicted acceptance to the confidence tables (in place)."""
    _ops().confidence_learn(realised, predicted, parents, depths, ranks, scores, path)


LINEAR_ROWS_PANEL = 16  # output columns per packed panel on the CPU (csrc/cpu/linear_rows.cpp kPanel)
LINEAR_ROWS_ALIGN = 8  # bfloat16 elements per 16-byte piece: K's padding on CUDA (csrc/cuda/linear_rows.cu)


def wgmma_runs(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the ops' automatic bfloat16 kernels here are the wgmma ones (verify_attn, linear_rows): bfloat16 on a
    compute capability 9.0 GPU (an H100/H200; the loader builds 9.0 as sm_90a)."""
    return device.type == "cuda" and dtype == torch.bfloat16 and torch.cuda.get_device_capability(device) == (9, 0)


def pack_linear_rows(weight: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """[N, K] or [G, N, K] weights packed for linear_rows on their device, once per weight (engine/model/batch_rows.py
    packs each on its first use), G = 1 for one weight. The CPU: float32 [G, ceil(N / 16), K, 16], panel p of group g
    holding columns 16p .. 16p + 15 of W_g^T, the last zero-padded. CUDA: [G, N, K'] in dtype (the x dtype the calls
    will pass), bfloat16 K zero-padded to K' a multiple of LINEAR_ROWS_ALIGN; the weight itself where it already is
    that (no copy)."""
    w = weight if weight.dim() == 3 else weight[None]
    if w.device.type == "cuda":
        w = w.to(dtype)
        pad = -w.shape[2] % LINEAR_ROWS_ALIGN if dtype == torch.bfloat16 else 0
        return torch.nn.functional.pad(w, (0, pad)).contiguous() if pad else w.contiguous()
    w = w.float()
    g, n, k = w.shape
    padded = torch.cat([w, w.new_zeros((g, -n % LINEAR_ROWS_PANEL, k))], dim=1)
    return padded.reshape(g, padded.shape[1] // LINEAR_ROWS_PANEL, LINEAR_ROWS_PANEL, k).transpose(2, 3).contiguous()


def linear_rows(x: Tensor, packed: Tensor, out_features: int, group_ends: Tensor | None = None) -> Tensor:
    """x [M, K] @ W^T (or x [M, G, K] through G weights, [M, G, N]; or with group_ends, each row of x [M, K]
    through its group's weight, [M, N]) with every row reduced in an order fixed by the row alone
    (batch-invariant); packed from pack_linear_rows."""
    if x.dim() == 2:
        return _ops().linear_rows(x[:, None], packed, out_features, group_ends)[:, 0]
    return _ops().linear_rows(x, packed, out_features, group_ends)


def rms_norm_rows(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm of x [..., D] with every row reduced in an order fixed by D alone (batch-invariant)."""
    return _ops().rms_norm_rows(x.reshape(-1, x.shape[-1]), weight, eps).view(x.shape)


def add_rms_norm(x: Tensor, delta: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """x + delta [..., D], and its RMSNorm by weight [D] (rms_norm_rows' bits), in one launch."""
    total, normed = _ops().add_rms_norm(x.reshape(-1, x.shape[-1]), delta.reshape(-1, delta.shape[-1]), weight, eps)
    return total.view(x.shape), normed.view(x.shape)


def silu_mul(gate_up: Tensor) -> Tensor:
    """silu(gate) * up of gate_up [..., 2I]'s two halves: [..., I], in one launch."""
    out = _ops().silu_mul(gate_up.reshape(-1, gate_up.shape[-1]))
    return out.view(*gate_up.shape[:-1], out.shape[-1])


def router_logits(x: Tensor, weight: Tensor) -> Tensor:
    """float32 logits [N, E] of x [N, H] (float32 or bfloat16) through the float32 router weight [E, H], every logit
    in an order fixed by H alone (batch-invariant)."""
    return _ops().router_logits(x, weight)


def moe_route(logits: Tensor, bias: Tensor, top_k: int, num_groups: int, top_groups: int, softmax: bool,
              normalize: bool, scaling: float, counts: Tensor | None = None, real: Tensor | None = None
              ) -> tuple[Tensor, Tensor]:
    """Each row's top_k experts [N, k] i64, best first, and their weights [N, k] f32; counts the chosen ids into
    counts (of the rows real marks) when given."""
    return _ops().moe_route(logits, bias, top_k, num_groups, top_groups, softmax, normalize, scaling, counts, real)


def expert_rows(x: Tensor, idx: Tensor, num_experts: int) -> tuple[Tensor, Tensor, Tensor]:
    """x's rows grouped by expert for the grouped matmuls: rows [N k, H], slots [N, k] and group_ends [E] int32."""
    return _ops().expert_rows(x, idx, num_experts)


def expert_combine(out: Tensor, slots: Tensor, weights: Tensor, group_ends: Tensor) -> Tensor:
    """Each token's k expert outputs (rows of out at its slots) weighted and summed in float32 in rank order: [N, H]."""
    return _ops().expert_combine(out, slots, weights, group_ends)


def cache_attn(q: Tensor, keys: Tensor, values: Tensor, num_visible: Tensor, scale: float) -> Tensor:
    """Attention of q [N, Hq, D] over the first num_visible rows of the keys and values [S, Hkv, D]: [N, Hq, D]."""
    return _ops().cache_attn(q, keys, values, num_visible, scale)


def head_norm_rope(x: Tensor, weight: Tensor | None, cos: Tensor, sin: Tensor, eps: float,
                   interleave: bool = False) -> Tensor:
    """RMSNorm of each head of x [M, H, D] by weight [H, D] (None: no norm), then the rotate-half RoPE at cos, sin
    [M, D/2] (interleave: of the pairs (2j, 2j + 1))."""
    return _ops().head_norm_rope(x, weight, cos, sin, eps, interleave)


def latent_write(kv: Tensor, weight: Tensor, cos: Tensor, sin: Tensor, eps: float, interleave: bool, ckv: Tensor,
                 kpe: Tensor, rows: Tensor) -> None:
    """Write a block's latent cache rows in place: ckv[rows] = the RMSNorm of kv [N, R + P]'s first R columns by
    weight [R], kpe[rows] = the RoPE of its last P at cos, sin [N, P/2] (rms_norm_rows' and head_norm_rope's bits)."""
    _ops().latent_write(kv, weight, cos, sin, eps, interleave, ckv, kpe, rows)


def context_write(kv: Tensor, k_norm: Tensor, rope: Tensor, start: Tensor, eps: float, keys: Tensor,
                  values: Tensor) -> None:
    """Write n rows of a DFlash drafter's context cache in place: keys[l, start + i, h] = the normed and turned key
    head g = l Hkv + h of kv [n, 2 G D]'s first G D columns (k_norm [G, D], angles rope [2, P, D/2] at start + i),
    values[l, start + i, h] = its value head from the last G D (head_norm_rope's bits)."""
    _ops().context_write(kv, k_norm, rope, start, eps, keys, values)


def _tree_build_fake(draft_logprobs: Tensor, root_token: Tensor, budget: int, budget_limit=None):
    num_nodes = budget + 1
    index = draft_logprobs.new_empty((num_nodes,), dtype=torch.int64)
    return (
        index,
        torch.empty_like(index),
        torch.empty_like(index),
        torch.empty_like(index),
        draft_logprobs.new_empty((num_nodes,)),
        draft_logprobs.new_empty((num_nodes, num_nodes), dtype=torch.bool),
    )


def _verify_attn_fake(q_lat, q_pe, ckv, kpe, prefix_len, block_mask, scale, batch_invariant=False):
    return torch.empty_like(q_lat), q_lat.new_empty(q_lat.shape[:2], dtype=torch.float32)


def _tree_accept_fake(tokens: Tensor, parents: Tensor, target: Tensor, max_depth: int):
    return tokens.new_empty((max_depth + 1,)), tokens.new_empty(()), tokens.new_empty(())


def _kv_compact_fake(ckv, kpe, prefix_len, path):
    return None


def _commit_path_fake(target, path, path_len, bonus, generated, num_generated, root, prefix_len):
    return None


def _budget_choose_fake(scores, parents, depths, ranks, realised, predicted, buckets, seconds):
    return buckets.new_empty(()), torch.empty_like(seconds), torch.empty_like(seconds)


def _confidence_learn_fake(realised, predicted, parents, depths, ranks, scores, path):
    return None


def _linear_rows_fake(x, packed, out_features, group_ends=None):
    return x.new_empty((x.shape[0], x.shape[1], out_features))


def _rms_norm_rows_fake(x, weight, eps):
    return torch.empty_like(x)


def _add_rms_norm_fake(x, delta, weight, eps):
    return torch.empty_like(x), torch.empty_like(x)


def _silu_mul_fake(gate_up):
    return gate_up.new_empty((gate_up.shape[0], gate_up.shape[1] // 2))


def _router_logits_fake(x, weight):
    return x.new_empty((x.shape[0], weight.shape[0]), dtype=torch.float32)


def _moe_route_fake(logits, bias, top_k, num_groups, top_groups, softmax, normalize, scaling, counts=None, real=None):
    return logits.new_empty((logits.shape[0], top_k), dtype=torch.int64), logits.new_empty((logits.shape[0], top_k))


def _expert_rows_fake(x, idx, num_experts):
    return (x.new_empty((idx.numel(), x.shape[1])), torch.empty_like(idx),
            idx.new_empty((num_experts,), dtype=torch.int32))


def _expert_combine_fake(out, slots, weights, group_ends):
    return out.new_empty((slots.shape[0], out.shape[1]))


def _cache_attn_fake(q, keys, values, num_visible, scale):
    return q.new_empty(q.shape)


def _head_norm_rope_fake(x, weight, cos, sin, eps, interleave=False):
    return x.new_empty(x.shape)


def _latent_write_fake(kv, weight, cos, sin, eps, interleave, ckv, kpe, rows):
    return None


def _context_write_fake(kv, k_norm, rope, start, eps, keys, values):
    return None


@functools.cache
def _register_fakes() -> None:
    for name, fake in (("tree_build", _tree_build_fake), ("verify_attn", _verify_attn_fake),
                       ("tree_accept", _tree_accept_fake), ("kv_compact", _kv_compact_fake),
                       ("commit_path", _commit_path_fake),
                       ("budget_choose", _budget_choose_fake), ("confidence_learn", _confidence_learn_fake),
                       ("linear_rows", _linear_rows_fake), ("rms_norm_rows", _rms_norm_rows_fake),
                       ("add_rms_norm", _add_rms_norm_fake), ("silu_mul", _silu_mul_fake),
                       ("router_logits", _router_logits_fake), ("moe_route", _moe_route_fake),
                       ("expert_rows", _expert_rows_fake),
                       ("expert_combine", _expert_combine_fake), ("cache_attn", _cache_attn_fake),
                       ("head_norm_rope", _head_norm_rope_fake), ("latent_write", _latent_write_fake),
                       ("context_write", _context_write_fake)):
        torch.library.register_fake(f"ddtree::{name}", fake)


@functools.cache
def _ops():
    """torch.ops.ddtree, loading the library (and registering the fakes) on first use."""
    ops = kernels.load()
    _register_fakes()
    return ops


if kernels.is_loaded():
    _register_fakes()
