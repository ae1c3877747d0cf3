// Split-KV bookkeeping shared by the verify_attn kernels (CUDA-core and tensor-core) and their combine step:
// which rows a split covers, and the constants of the online softmax in log2 units.
#pragma once

#include <cstdint>

#include "common.cuh"
#include "verify_attn.cuh"

namespace ddtree::cuda {

constexpr int kMaxSplits = 256;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }

// Per block: the rows [begin, end) of the visible range [0, prefix_len + N) that this split covers.
struct SplitRows {
  int prefix;
  int begin;
  int end;
};

template <typename T>
__device__ SplitRows split_rows(const VerifyAttnArgs<T>& a, int split, int tile_rows) {
  const int64_t raw = *a.prefix_len;
  const int prefix = static_cast<int>(min(max(raw, int64_t{0}), static_cast<int64_t>(a.cache_rows - a.num_nodes)));
  const int len = prefix + a.num_nodes;
  const int per_split = round_up(ceil_div(len, a.num_splits), tile_rows);
  const int begin = split * per_split;
  return {prefix, begin, min(len, begin + per_split)};
}

}  // namespace ddtree::cuda
