// The routing kernel (moe_route.cuh has the contract and the layout).
#include <algorithm>

#include "../route_exp.h"
#include "common.cuh"
#include "moe_route.cuh"

namespace ddtree::cuda {
namespace {

constexpr int kMaxWarps = 4;               // rows a block
constexpr size_t kSmemBudget = 96 * 1024;  // a block's scores, choices, group scores (sm_86/89 allow 99 KB)
constexpr int kNone = -1;                  // a Pick's index when it holds no element

// Whether (a, i) comes before (b, j): the larger value first, NaN before every number, ties to the lower index.
__device__ __forceinline__ bool before(float a, int i, float b, int j) {
  const bool a_nan = isnan(a), b_nan = isnan(b);
  if (a_nan != b_nan) return a_nan;
  if (!a_nan && a != b) return a > b;
  return i < j;
}

struct Pick {
  float value;
  int index;  // kNone: no element
};

__device__ __forceinline__ bool better(const Pick& p, const Pick& q) {
  return p.index != kNone && (q.index == kNone || before(p.value, p.index, q.value, q.index));
}

// The best of the warp's picks, on every lane (a symmetric choice in a total order: each lane ends with the same).
__device__ __forceinline__ Pick warp_best(Pick p) {
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) {
    const Pick other{__shfl_xor_sync(kFullMask, p.value, offset), __shfl_xor_sync(kFullMask, p.index, offset)};
    if (better(other, p)) p = other;
  }
  return p;
}

// The best of values[0 .. n) strictly after `prev` in the order (the first when prev is kNone), on every lane.
__device__ __forceinline__ Pick best_after(const float* values, int n, const Pick& prev, int lane) {
  Pick best{0.0f, kNone};
  for (int i = lane; i < n; i += kWarpSize) {
    const Pick here{values[i], i};
    const bool after = prev.index == kNone || before(prev.value, prev.index, here.value, i);
    if (after && better(here, best)) best = here;
  }
  return warp_best(best);
}

// The sum of group[0 .. n)'s best min(2, n) choices, best first, from 0.0f like the CPU's.
__device__ __forceinline__ float group_score(const float* group, int n) {
  int first = 0, second = kNone;
  for (int j = 1; j < n; ++j) {
    if (before(group[j], j, group[first], first)) {
      second = first;
      first = j;
    } else if (second == kNone || before(group[j], j, group[second], second)) {
      second = j;
    }
  }
  float sum = 0.0f;
  sum += group[first];
  if (second != kNone) sum += group[second];
  return sum;
}

// Fills scores [E] and choice [E] = scores + bias. A softmax row's sum: lane chains, then warp_sum's butterfly (the
// CPU kernel adds in this order too).
__device__ __forceinline__ void choose(const MoeRouteArgs& a, const float* logits, float* scores, float* choice,
                                       int lane) {
  const int num_experts = a.num_experts;
  if (a.softmax) {
    float top = neg_inf();  // fmaxf skips NaN as the CPU's std::max does
    for (int e = lane; e < num_experts; e += kWarpSize) top = fmaxf(top, logits[e]);
    for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) {
      top = fmaxf(top, __shfl_xor_sync(kFullMask, top, offset));
    }
    float total = 0.0f;
    for (int e = lane; e < num_experts; e += kWarpSize) total += scores[e] = route_exp(logits[e] - top);
    total = warp_sum(total);
    for (int e = lane; e < num_experts; e += kWarpSize) {
      scores[e] /= total;
      choice[e] = scores[e] + a.bias[e];
    }
  } else {
#pragma unroll 4
    for (int e = lane; e < num_experts; e += kWarpSize) {
      scores[e] = 1.0f / (1.0f + route_exp(-logits[e]));
      choice[e] = scores[e] + a.bias[e];
    }
  }
}

// Keeps the top_groups best groups by group score: every other group's choices become -inf.
__device__ __forceinline__ void filter_groups(const MoeRouteArgs& a, float* choice, float* group_scores, int lane) {
  const int per_group = a.num_experts / a.num_groups;
  for (int g = lane; g < a.num_groups; g += kWarpSize) group_scores[g] = group_score(choice + g * per_group, per_group);
  __syncwarp();
  Pick last{0.0f, kNone};
  for (int t = 0; t < a.top_groups; ++t) last = best_after(group_scores, a.num_groups, last, lane);
  for (int e = lane; e < a.num_experts; e += kWarpSize) {
    const int g = e / per_group;  // kept: the last kept group or one before it
    if (g != last.index && !before(group_scores[g], g, last.value, last.index)) choice[e] = neg_inf();
  }
  __syncwarp();
}

// Warp w of a block routes row blockIdx.x * (warps a block) + w, its scores, choices and group scores at w (2E + G)
// floats.
__global__ void __launch_bounds__(kMaxWarps * kWarpSize) moe_route_kernel(const MoeRouteArgs a) {
  extern __shared__ float shared[];
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int row = blockIdx.x * (blockDim.x / kWarpSize) + warp;
  if (row >= a.num_rows) return;
  float* scores = shared + warp * (2 * a.num_experts + a.num_groups);  // [E]
  float* choice = scores + a.num_experts;                               // [E]
  float* group_scores = choice + a.num_experts;                         // [G]
  choose(a, a.logits + static_cast<int64_t>(row) * a.num_experts, scores, choice, lane);
  __syncwarp();
  if (a.num_groups > 1 && a.top_groups < a.num_groups) filter_groups(a, choice, group_scores, lane);

  int64_t* idx = a.idx + static_cast<int64_t>(row) * a.top_k;
  float* weights = a.weights + static_cast<int64_t>(row) * a.top_k;
  const bool counted = a.counts != nullptr && (a.real == nullptr || a.real[row]);
  Pick pick{0.0f, kNone};
  float total = 0.0f;  // the weights' sum in rank order
  for (int r = 0; r < a.top_k; ++r) {
    pick = best_after(choice, a.num_experts, pick, lane);
    if (lane == 0) {
      const float w = scores[pick.index];
      idx[r] = pick.index;
      weights[r] = w;
      total += w;
      if (counted) atomicAdd(&a.counts[pick.index], 1);
    }
  }
  if (lane != 0) return;
  for (int r = 0; r < a.top_k; ++r) {  // rewrites lane 0's own writes: program order holds
    float w = weights[r];
    if (a.normalize) w /= total + 1e-20f;
    weights[r] = w * a.scaling;
  }
}

}  // namespace

cudaError_t MoeRoute(const MoeRouteArgs& a, cudaStream_t stream) {
  if (a.num_rows == 0) return cudaSuccess;
  const size_t warp_bytes = static_cast<size_t>(2 * a.num_experts + a.num_groups) * sizeof(float);
  const int fit = static_cast<int>(std::max<size_t>(1, kSmemBudget / warp_bytes));
  const int warps = std::min({kMaxWarps, fit, a.num_rows});
  const size_t smem = warps * warp_bytes;
  DDTREE_CUDA_TRY(allow_dynamic_smem(moe_route_kernel, smem));
  moe_route_kernel<<<ceil_div(a.num_rows, warps), warps * kWarpSize, smem, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace ddtree::cuda
