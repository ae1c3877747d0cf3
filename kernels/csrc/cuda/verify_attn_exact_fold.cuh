// What the batch-invariant tensor-core kernel (verify_attn_exact_wgmma.cu) and its combine step
// (verify_attn_exact_combine.cu) share: the workspace of partials and the fold (design:
// verify_attn_exact_wgmma.cuh).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common.cuh"
#include "verify_attn_exact_wgmma.cuh"
#include "verify_attn_wgmma_tile.cuh"

namespace ddtree::cuda::exact_sm90 {

using tc_sm90::bf16;
using tc_sm90::kLat;
using tc_sm90::kRows;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kCombineThreads = 128;
// Partial outputs per combine stage: 64 KB of shared memory, so that a row's are all in flight at once.
__host__ __device__ constexpr int combine_stage_slots(bool group_per_block) { return group_per_block ? 32 : 128; }

// Slots (splits, or groups when group_per_block) of the longest row a cache of cache_rows can hold: no row has more
// than split_target splits, nor more than one per kSplitRows positions.
__host__ __device__ inline int num_slots(int cache_rows, int split_target, bool group_per_block) {
  const int splits = min(split_target, ceil_div(cache_rows, kSplitRows));
  return group_per_block ? ceil_div(splits, kGroupSplits) : splits;
}

// The workspace: [slots, N*H, R] unnormalised outputs, then [slots, N*H, 2] (max in log2 units, sum).
struct Partials {
  float* o;
  float* ml;
  size_t num_rows;
};

// The rows of the launch's chunk of nodes [node0, node0 + chunk_nodes): row r of the workspace is (node, head)
// row node0 * H + r.
__device__ __forceinline__ Partials partials(const VerifyAttnExactArgs<bf16>& a) {
  const size_t num_rows = static_cast<size_t>(a.chunk_nodes) * a.num_heads;
  const size_t slots = num_slots(a.cache_rows, a.split_target, a.group_per_block);
  return {a.workspace, a.workspace + slots * num_rows * kLat, num_rows};
}

__device__ __forceinline__ int clamped_prefix(const VerifyAttnExactArgs<bf16>& a) {
  const int64_t raw = *a.prefix_len;
  return static_cast<int>(min(max(raw, int64_t{0}), static_cast<int64_t>(a.cache_rows - a.num_nodes)));
}

// One fold step, (M, L, O) <- fold((M, L, O), (m, l, o)): the coefficients a, b of the state and the part.
struct Fold {
  float a, b;
};
__device__ __forceinline__ Fold fold_ml(float& big_m, float& big_l, float m, float l) {
  const float m_new = fmaxf(big_m, m);
  const Fold f{exp2f(big_m - m_new), exp2f(m - m_new)};
  big_l = __fmaf_rn(big_l, f.a, __fmul_rn(l, f.b));
  big_m = m_new;
  return f;
}
__device__ __forceinline__ float fold_o(float state, float part, Fold f) {
  return __fmaf_rn(state, f.a, __fmul_rn(part, f.b));
}

// The combine kernel of the chunk of nodes [node0, node0 + a.chunk_nodes) (verify_attn_exact_combine.cu).
cudaError_t launch_combine(const VerifyAttnExactArgs<bf16>& a, int node0, bool group_per_block, cudaStream_t stream);

}  // namespace ddtree::cuda::exact_sm90
