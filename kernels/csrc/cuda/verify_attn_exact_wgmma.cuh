// verify_attn's batch-invariant kernel on the tensor cores (sm_90a, bfloat16, R = 512, P = 64): the fast
// kernel's tile loop (verify_attn_wgmma.cu) over a canonical reduction that depends on each row alone.
//
// The canonical reduction of a (node, head) row. Its keys are its logical sequence: the prefix rows, then its
// visible block rows in index order (for a tree node its ancestors and itself: AR's rows at its position after
// kv_compact). Positions are cut, from position 0, into tiles of 64, splits of split_rows_for(its length) and
// groups of kGroupSplits splits. A split's partial (m, l, O) is an online softmax over its tiles in order, each tile's
// S = Q K^T and O = O * alpha + P V one wgmma chain; a group's partial is the left fold of its splits'
// partials, the result the left fold of the groups' partials, where fold((M, L, O), (m, l, o)) =
// (M', L a + l b, O a + o b) with M' = max(M, m), a = 2^(M - M'), b = 2^(m - M') (one rounding per
// operation, written out with __fmul_rn / __fmaf_rn so no contraction differs between kernels).
//
// None of it depends on N, on the cache slots of the block rows or on how the work is spread, because
//   - a query tile holds one node's heads only (64 of them; padding rows past H are zeros), so the MMAs'
//     operands are the same bits whatever else the call holds: a tree node's tile equals AR's;
//   - a tile's K and V rows are the node's logical rows, gathered, so each key sits in the same MMA lane;
//   - the split, group and fold order are fixed by position and the row's own length (a tree node's is AR's
//     length at its position); only how they map onto blocks changes:
//     a block per split (few rows: N = 1 needs the parallelism; the combine kernel folds splits, then
//     groups) or a block per group (many rows; the block folds its splits into an L2-resident state, the
//     combine kernel folds the groups). Both run the same fold, so both give the same bits.
// prefix_len is read on the device and clamped into [0, S - N], as in verify_attn.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>

#include "verify_attn_exact.cuh"

namespace ddtree::cuda::exact_sm90 {

constexpr int kSplitRows = 256;          // positions of the shortest split
constexpr int kGroupSplits = 8;          // splits per group
constexpr int kDefaultSplitTarget = 32;  // DDTREE_VERIFY_ATTN_EXACT_SPLITS unset
constexpr int kMaxSplitTarget = 128;     // the combine step stages up to 128 partials of a row at once

// Positions per split of a row of `len` keys: the shortest kSplitRows x 2^k that cuts it into at most `target`
// splits. Longer rows take longer splits, so a large N folds its state less often (each fold costs about three
// tile steps) while N = 1 keeps `target` splits to spread over the GPU.
__host__ __device__ inline int split_rows_for(int len, int target) {
  int rows = kSplitRows;
  while (rows < (1 << 30) && (len + rows - 1) / rows > target) rows *= 2;
  return rows;
}

// Built for sm_90a, on a compute capability 9.0 device, bfloat16 R = 512, P = 64, 16-byte aligned inputs.
bool supported(const VerifyAttnExactArgs<__nv_bfloat16>& a);

// Whether a block per group (else a block per split) has the lower modelled time at this size.
bool group_per_block(int num_nodes, int num_heads, int cache_rows, int split_target, int num_sms);

size_t workspace_bytes(int num_nodes, int num_heads, int cache_rows, int split_target, bool group_per_block);

// Nodes per launch, so that the workspace stays within kMaxWorkspaceBytes (a prefill-sized N at a long S would
// need tens of GB at once). A tile holds one node's heads, so the chunking changes no bit of any row.
constexpr size_t kMaxWorkspaceBytes = size_t{1} << 30;
int chunk_nodes(int num_nodes, int num_heads, int cache_rows, int split_target, bool group_per_block);

// The tile kernel and the combine kernel per chunk of nodes; a.split_target, a.group_per_block and a.chunk_nodes are
// set and a.workspace holds workspace_bytes(a.chunk_nodes, ...).
cudaError_t launch(const VerifyAttnExactArgs<__nv_bfloat16>& a, cudaStream_t stream);

}  // namespace ddtree::cuda::exact_sm90
