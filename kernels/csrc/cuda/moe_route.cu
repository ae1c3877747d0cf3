// The routing kernel (moe_route.cuh has the contract and the layout).
#include <algorithm>

#include "../route_exp.h"
#include "common.cuh"
#include "moe_route.cuh"

namespace ddtree::cuda {
namespace {

constexpr int kMaxWarps = 4;               // rows a block
constexpr size_t kSmemBudget = 96 * 1024;  // a block's scores, choices, group scores, picks (sm_86/89 allow 99 KB)
constexpr uint32_t kIndexBase = 0x7fffffffu;

// An element's place in the order "larger first, NaN above every number, ties to the lower index" as one integer,
// the larger key first: the value's bits made monotone (float_key; NaN on top), then the index reversed. Every key
// lies strictly between 0 (no element) and ~0 (above every element), and no two elements of a row share one.
__device__ __forceinline__ uint64_t order_key(float value, int index) {
  const uint32_t bits = isnan(value) ? 0xffffffffu : float_key(value);
  return (static_cast<uint64_t>(bits) << 32) | (kIndexBase - static_cast<uint32_t>(index));
}

__device__ __forceinline__ int index_of(uint64_t key) {
  return static_cast<int>(kIndexBase - static_cast<uint32_t>(key));
}

// A lane's elements values[lane], values[lane + 32], ... as keys: in registers where n <= 32 * kPerLane, so that a
// lane looks again at its elements without loads (kPerLane = 16 holds Kimi-K2's 384 experts and DeepSeek-V3's 256).
constexpr int kKeysPerLane = 16;

struct RegisterKeys {
  uint64_t key[kKeysPerLane];

  __device__ __forceinline__ RegisterKeys(const float* values, int n, int lane) {
#pragma unroll
    for (int j = 0; j < kKeysPerLane; ++j) {
      const int i = lane + j * kWarpSize;
      key[j] = i < n ? order_key(values[i], i) : 0;
    }
  }

  // The largest key below `bound` (0: none).
  __device__ __forceinline__ uint64_t best_below(uint64_t bound) const {
    uint64_t best = 0;
#pragma unroll
    for (int j = 0; j < kKeysPerLane; ++j) {
      if (key[j] < bound && key[j] > best) best = key[j];
    }
    return best;
  }
};

// The same over shared memory, for rows of more elements: each look computes the keys again.
struct SharedKeys {
  const float* values;
  int n, lane;

  __device__ __forceinline__ SharedKeys(const float* values, int n, int lane) : values(values), n(n), lane(lane) {}

  __device__ __forceinline__ uint64_t best_below(uint64_t bound) const {
    uint64_t best = 0;
#pragma unroll 4
    for (int i = lane; i < n; i += kWarpSize) {
      const uint64_t key = order_key(values[i], i);
      if (key < bound && key > best) best = key;
    }
    return best;
  }
};

__device__ __forceinline__ uint64_t warp_max(uint64_t key) {
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) {
    const uint64_t other = __shfl_xor_sync(kFullMask, key, offset);
    if (other > key) key = other;
  }
  return key;
}

template <typename Keys, typename Pick>
__device__ __forceinline__ uint64_t top_of(const Keys& keys, int count, int lane, Pick pick) {
  uint64_t mine = keys.best_below(~uint64_t{0}), best = 0;
  for (int r = 0; r < count; ++r) {
    best = warp_max(mine);
    const int index = index_of(best);
    if (index % kWarpSize == lane) mine = keys.best_below(best);
    pick(r, index);
  }
  return best;
}

// The `count` best of values[0 .. n), best first: pick(rank, index) on every lane for each; returns the last one's key.
// Each lane keeps its own best not yet picked, so a pick is one warp max, and only the lane that held it looks again
// (strictly below it: everything above is picked already).
template <typename Pick>
__device__ __forceinline__ uint64_t top(const float* values, int n, int count, int lane, Pick pick) {
  if (n <= kWarpSize * kKeysPerLane) return top_of(RegisterKeys(values, n, lane), count, lane, pick);
  return top_of(SharedKeys(values, n, lane), count, lane, pick);
}

// The sum of group[0 .. n)'s best min(2, n) values, best first, from 0.0f like the CPU's.
__device__ __forceinline__ float group_score(const float* group, int n) {
  uint64_t first = 0, second = 0;
  for (int j = 0; j < n; ++j) {
    const uint64_t key = order_key(group[j], j);
    if (key > first) {
      second = first;
      first = key;
    } else if (key > second) {
      second = key;
    }
  }
  float sum = 0.0f;
  sum += group[index_of(first)];
  if (second != 0) sum += group[index_of(second)];
  return sum;
}

// scores[e] = logits[e] and choice[e] = bias[e]: a lane's loads issued kKeysPerLane at a time, all in flight together
// (one warp alone on its SM waits out each round trip, so a round trip per element made most of the kernel's time).
__device__ __forceinline__ void stage(const float* logits, const float* bias, int n, float* scores, float* choice,
                                      int lane) {
  for (int base = lane; base < n; base += kWarpSize * kKeysPerLane) {
    float l[kKeysPerLane], b[kKeysPerLane];
#pragma unroll
    for (int j = 0; j < kKeysPerLane; ++j) {
      const int e = base + j * kWarpSize;
      l[j] = e < n ? __ldg(logits + e) : 0.0f;
      b[j] = e < n ? __ldg(bias + e) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kKeysPerLane; ++j) {
      const int e = base + j * kWarpSize;
      if (e < n) {
        scores[e] = l[j];
        choice[e] = b[j];
      }
    }
  }
}

// Fills scores [E] and choice [E] = scores + bias. A softmax row's sum: lane chains, then warp_sum's butterfly (the
// CPU kernel adds in this order too).
__device__ __forceinline__ void choose(const MoeRouteArgs& a, const float* logits, float* scores, float* choice,
                                       int lane) {
  const int num_experts = a.num_experts;
  stage(logits, a.bias, num_experts, scores, choice, lane);
  if (a.softmax) {
    float top = neg_inf();  // fmaxf skips NaN as the CPU's std::max does
    for (int e = lane; e < num_experts; e += kWarpSize) top = fmaxf(top, scores[e]);
    for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) {
      top = fmaxf(top, __shfl_xor_sync(kFullMask, top, offset));
    }
    float total = 0.0f;
    for (int e = lane; e < num_experts; e += kWarpSize) total += scores[e] = route_exp(scores[e] - top);
    total = warp_sum(total);
    for (int e = lane; e < num_experts; e += kWarpSize) {
      scores[e] /= total;
      choice[e] += scores[e];
    }
  } else {
#pragma unroll 4
    for (int e = lane; e < num_experts; e += kWarpSize) {
      scores[e] = 1.0f / (1.0f + route_exp(-scores[e]));
      choice[e] += scores[e];
    }
  }
}

// Keeps the top_groups best groups by group score: every other group's choices become -inf.
__device__ __forceinline__ void filter_groups(const MoeRouteArgs& a, float* choice, float* group_scores, int lane) {
  const int per_group = a.num_experts / a.num_groups;
  for (int g = lane; g < a.num_groups; g += kWarpSize) group_scores[g] = group_score(choice + g * per_group, per_group);
  __syncwarp();
  const uint64_t last = top(group_scores, a.num_groups, a.top_groups, lane, [](int, int) {});
  for (int e = lane; e < a.num_experts; e += kWarpSize) {
    const int g = e / per_group;
    if (order_key(group_scores[g], g) < last) choice[e] = neg_inf();
  }
  __syncwarp();
}

// Warp w of a block routes row blockIdx.x * (warps a block) + w, its scores, choices, group scores and picks at
// w (2E + G + k) words.
__global__ void __launch_bounds__(kMaxWarps * kWarpSize) moe_route_kernel(const MoeRouteArgs a) {
  extern __shared__ float shared[];
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int row = blockIdx.x * (blockDim.x / kWarpSize) + warp;
  if (row >= a.num_rows) return;
  float* scores = shared + warp * (2 * a.num_experts + a.num_groups + a.top_k);  // [E]
  float* choice = scores + a.num_experts;                                         // [E]
  float* group_scores = choice + a.num_experts;                                   // [G]
  int* picked = reinterpret_cast<int*>(group_scores + a.num_groups);              // [k]
  choose(a, a.logits + static_cast<int64_t>(row) * a.num_experts, scores, choice, lane);
  __syncwarp();
  if (a.num_groups > 1 && a.top_groups < a.num_groups) filter_groups(a, choice, group_scores, lane);

  float total = 0.0f;  // the weights' sum in rank order, on lane 0
  top(choice, a.num_experts, a.top_k, lane, [&](int r, int e) {
    if (lane == 0) {
      picked[r] = e;
      total += scores[e];
    }
  });
  total = __shfl_sync(kFullMask, total, 0);
  __syncwarp();
  int64_t* idx = a.idx + static_cast<int64_t>(row) * a.top_k;
  float* weights = a.weights + static_cast<int64_t>(row) * a.top_k;
  const bool counted = a.counts != nullptr && (a.real == nullptr || a.real[row]);
  for (int r = lane; r < a.top_k; r += kWarpSize) {
    const int e = picked[r];
    float w = scores[e];
    if (a.normalize) w /= total + 1e-20f;
    idx[r] = e;
    weights[r] = w * a.scaling;
    if (counted) atomicAdd(&a.counts[e], 1);
  }
}

}  // namespace

cudaError_t MoeRoute(const MoeRouteArgs& a, cudaStream_t stream) {
  if (a.num_rows == 0) return cudaSuccess;
  const size_t warp_bytes = static_cast<size_t>(2 * a.num_experts + a.num_groups + a.top_k) * sizeof(float);
  const int fit = static_cast<int>(std::max<size_t>(1, kSmemBudget / warp_bytes));
  const int warps = std::min({kMaxWarps, fit, a.num_rows});
  const size_t smem = warps * warp_bytes;
  DDTREE_CUDA_TRY(allow_dynamic_smem(moe_route_kernel, smem));
  moe_route_kernel<<<ceil_div(a.num_rows, warps), warps * kWarpSize, smem, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace ddtree::cuda
