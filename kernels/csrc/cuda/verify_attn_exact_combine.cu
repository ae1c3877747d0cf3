// verify_attn's batch-invariant combine step: the splits' and groups' partials folded in position order
// (design: verify_attn_exact_wgmma.cuh).
#include <algorithm>
#include <cstdint>

#include "common.cuh"
#include "verify_attn_exact_fold.cuh"
#include "verify_attn_mma.cuh"

namespace ddtree::cuda::exact_sm90 {
namespace {

// Block per (node, head) row and slice of kCols columns, kCombineThreads threads of kVec columns: a
// block per split has many slots and few rows (N = 1: 32 slots of 1024 positions at S = 32768), so it takes a
// quarter of a row (kVec = 1), a block per group the whole row (kVec = 4). Every slot's (m, l) is read at
// once into shared memory; warp 0 folds them, the splits of each group (a block per split) then the groups,
// and leaves each step's coefficients in shared memory; the partial outputs come in stages of up to
// combine_stage_slots (cp.async, all in flight together; shared memory sized to the slots, not the most) and each thread folds its columns in slot order. The active slots are a
// prefix of them: a row's positions run from 0 without gaps.
template <bool kGroupPerBlock>
__global__ void __launch_bounds__(kCombineThreads) verify_attn_exact_combine_kernel(VerifyAttnExactArgs<bf16> a,
                                                                                     int node0) {
  constexpr int kVec = kGroupPerBlock ? 4 : 1;
  constexpr int kCols = kCombineThreads * kVec;
  extern __shared__ float s_dyn[];
  __shared__ int s_num_groups, s_num_active;
  __shared__ float s_inv;
  const size_t ws_row = blockIdx.x / (kLat / kCols);  // the workspace's; the output's is node0 * H + ws_row
  const size_t row = static_cast<size_t>(node0) * a.num_heads + ws_row;
  const int col0 = blockIdx.x % (kLat / kCols) * kCols;
  const Partials ws = partials(a);
  wait_for_previous_grid();  // the tile kernel's partials (a dependent launch)
  const int slots = num_slots(a.cache_rows, a.split_target, kGroupPerBlock);
  const int num_groups = kGroupPerBlock ? slots : ceil_div(slots, kGroupSplits);
  float* s_stage = s_dyn;                              // [stage_slots, kCols]
  const int stage_slots = min(combine_stage_slots(kGroupPerBlock), slots);
  float* s_ml = s_stage + stage_slots * kCols;         // [slots, 2]
  float* split_coef = s_ml + 2 * slots;                // [slots, 2] (a block per split)
  float* group_coef = split_coef + 2 * slots;          // [groups, 2]
  float* group_ml = group_coef + 2 * num_groups;       // [groups, 2]
  int* group_splits = reinterpret_cast<int*>(group_ml + 2 * num_groups);  // [groups]
  for (int s = threadIdx.x; s < slots; s += kCombineThreads) {
    const float2 v = *reinterpret_cast<const float2*>(ws.ml + 2 * (s * ws.num_rows + ws_row));
    s_ml[2 * s] = v.x, s_ml[2 * s + 1] = v.y;
  }
  __syncthreads();
  if (threadIdx.x < kWarpSize) {
    for (int g = threadIdx.x; g < num_groups; g += kWarpSize) {
      float big_m = neg_inf(), big_l = 0.0f;
      int n = 0;
      const int first = kGroupPerBlock ? g : g * kGroupSplits;
      const int last = kGroupPerBlock ? g + 1 : min(slots, first + kGroupSplits);
      for (int s = first; s < last && s_ml[2 * s] != neg_inf(); ++s, ++n) {  // -inf: past the row's keys
        if (n == 0) {
          big_m = s_ml[2 * s], big_l = s_ml[2 * s + 1];
        } else {
          const Fold f = fold_ml(big_m, big_l, s_ml[2 * s], s_ml[2 * s + 1]);
          split_coef[2 * s] = f.a, split_coef[2 * s + 1] = f.b;
        }
      }
      group_splits[g] = n;
      group_ml[2 * g] = big_m, group_ml[2 * g + 1] = big_l;
    }
    __syncwarp();
    if (threadIdx.x == 0) {
      float big_m = neg_inf(), big_l = 0.0f;
      int g = 0, num_active = 0;
      for (; g < num_groups && group_splits[g] > 0; num_active += group_splits[g], ++g) {
        if (g == 0) {
          big_m = group_ml[0], big_l = group_ml[1];
        } else {
          const Fold f = fold_ml(big_m, big_l, group_ml[2 * g], group_ml[2 * g + 1]);
          group_coef[2 * g] = f.a, group_coef[2 * g + 1] = f.b;
        }
      }
      s_num_groups = g, s_num_active = num_active;
      s_inv = g > 0 ? 1.0f / big_l : 0.0f;
      if (col0 == 0) a.lse[row] = g > 0 ? (big_m + log2f(big_l)) * kLn2 : neg_inf();
    }
  }
  __syncthreads();
  const int num_active = s_num_active;
  float out[kVec] = {}, o_g[kVec] = {};
  for (int base = 0; base < num_active; base += stage_slots) {
    const int n = min(stage_slots, num_active - base);
    __syncthreads();  // the previous stage is consumed
    for (int e = threadIdx.x; e < n * (kCols / 4); e += kCombineThreads) {
      const int s = e / (kCols / 4), c = e % (kCols / 4) * 4;
      cp_async_16(s_stage + s * kCols + c, ws.o + ((base + s) * ws.num_rows + ws_row) * kLat + col0 + c, true);
    }
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();
#pragma unroll 4
    for (int i = 0; i < n; ++i) {
      const int s = base + i;
      float v[kVec];
#pragma unroll
      for (int c = 0; c < kVec; ++c) v[c] = s_stage[i * kCols + threadIdx.x * kVec + c];
      if (kGroupPerBlock) {
        const Fold f{group_coef[2 * s], group_coef[2 * s + 1]};
#pragma unroll
        for (int c = 0; c < kVec; ++c) out[c] = s == 0 ? v[c] : fold_o(out[c], v[c], f);
      } else {
        const int g = s / kGroupSplits, k = s % kGroupSplits;
        const Fold f{split_coef[2 * s], split_coef[2 * s + 1]}, fg{group_coef[2 * g], group_coef[2 * g + 1]};
        const bool group_done = k == group_splits[g] - 1;
#pragma unroll
        for (int c = 0; c < kVec; ++c) {
          o_g[c] = k == 0 ? v[c] : fold_o(o_g[c], v[c], f);
          if (group_done) out[c] = g == 0 ? o_g[c] : fold_o(out[c], o_g[c], fg);
        }
      }
    }
  }
  bf16* dst = a.o_lat + row * kLat + col0 + threadIdx.x * kVec;
#pragma unroll
  for (int c = 0; c < kVec; ++c) dst[c] = __float2bfloat16_rn(out[c] * s_inv);
}

}  // namespace

cudaError_t launch_combine(const VerifyAttnExactArgs<bf16>& a, int node0, bool group_per_block, cudaStream_t stream) {
  const int slots = num_slots(a.cache_rows, a.split_target, group_per_block);
  const int num_groups = group_per_block ? slots : ceil_div(slots, kGroupSplits);
  const int cols = kCombineThreads * (group_per_block ? 4 : 1);
  const int stage_slots = std::min(combine_stage_slots(group_per_block), slots);  // sized to fit, for occupancy
  const size_t smem = (static_cast<size_t>(stage_slots) * cols + 4 * slots + 5 * num_groups) * sizeof(float);
  const auto combine = group_per_block ? verify_attn_exact_combine_kernel<true> : verify_attn_exact_combine_kernel<false>;
  DDTREE_CUDA_TRY(allow_dynamic_smem(combine, smem));
  // A dependent launch: its blocks are placed while the tile kernel's last blocks finish, and wait for them.
  return launch_dependent(combine, a.chunk_nodes * a.num_heads * (kLat / cols), kCombineThreads, smem, stream, a,
                          node0);
}

}  // namespace ddtree::cuda::exact_sm90
