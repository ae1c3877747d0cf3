// Split-KV bookkeeping shared by the verify_attn kernels (CUDA-core and tensor-core) and their combine step:
// which rows a split covers, and the constants of the online softmax in log2 units.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common.cuh"
#include "verify_attn.cuh"

namespace ddtree::cuda {

constexpr int kMaxSplits = kVerifyAttnMaxSplits;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

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

// Split count for a tensor-core kernel of one block per multiprocessor and 64-row query and cache tiles,
// all blocks of a launch equally long: the count with the least modelled time, waves x (cache tiles per
// split + fixed_tiles for the launch, the query load, pipeline fill and epilogue) x tile_us, plus for
// several splits the combine kernel (~1 us, and ~1.4 ns per partial row it reads: measured on the H200).
// Counts past one wave only pay when a wave has few tiles; the smallest count wins ties.
inline int modelled_splits(int num_nodes, int num_heads, int cache_rows, int num_sms, double tile_us,
                           double fixed_tiles) {
  const int64_t query_tiles = std::max(1, ceil_div(num_nodes * num_heads, 64));
  const int kv_tiles = std::max(1, ceil_div(cache_rows, 64));
  const double partial_rows = static_cast<double>(num_nodes) * num_heads;
  int best = 1;
  double best_us = 0.0;
  for (int s = 1; s <= std::min(kv_tiles, kMaxSplits); ++s) {
    const int64_t waves = (query_tiles * s + num_sms - 1) / std::max(1, num_sms);
    double us = static_cast<double>(waves) * (ceil_div(kv_tiles, s) + fixed_tiles) * tile_us;
    if (s > 1) us += 1.0 + 1.4e-3 * s * partial_rows;
    if (s == 1 || us < best_us) best = s, best_us = us;
  }
  return best;
}

// With several splits the workspace holds [splits, N*H, R] unnormalised outputs, then [splits, N*H, 2]
// (row max in log2 units, row sum); `row` is the (node, head) row index.
template <typename T>
__device__ __forceinline__ float* partial_o(const VerifyAttnArgs<T>& a, int split, size_t row) {
  return a.workspace + (static_cast<size_t>(split) * a.num_nodes * a.num_heads + row) * a.lat_dim;
}

template <typename T>
__device__ __forceinline__ float* partial_ml(const VerifyAttnArgs<T>& a, int split, size_t row) {
  const size_t num_rows = static_cast<size_t>(a.num_nodes) * a.num_heads;
  return a.workspace + a.num_splits * num_rows * a.lat_dim + 2 * (split * num_rows + row);
}

// A row's softmax statistics: lse with one split (-inf when it saw nothing), (max, sum) with several.
template <typename T>
__device__ __forceinline__ void store_ml(const VerifyAttnArgs<T>& a, int split, size_t row, float m, float l) {
  if (a.num_splits == 1) {
    a.lse[row] = l > 0.0f ? (m + log2f(l)) * kLn2 : neg_inf();
  } else {
    float* ml = partial_ml(a, split, row);
    ml[0] = m;
    ml[1] = l;
  }
}

// Value columns col, col + 1 of a bfloat16 row: o / l into o_lat with one split, unnormalised o otherwise.
__device__ __forceinline__ void store_o_pair(const VerifyAttnArgs<__nv_bfloat16>& a, int split, size_t row, int col,
                                             float o0, float o1, float l) {
  if (a.num_splits == 1) {
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    *reinterpret_cast<uint32_t*>(a.o_lat + row * a.lat_dim + col) = pack_bf16(o0 * inv, o1 * inv);
  } else {
    *reinterpret_cast<float2*>(partial_o(a, split, row) + col) = make_float2(o0, o1);
  }
}

// The block_mask row of a tensor-core tile's query row (node, head) = row; padding rows past N * H take
// any valid node (their results are never written).
template <typename T>
__device__ __forceinline__ const bool* tile_mask_row(const VerifyAttnArgs<T>& a, int row) {
  return a.block_mask + static_cast<size_t>(min(row / a.num_heads, a.num_nodes - 1)) * a.num_nodes;
}

// Whether cache row u is visible to the node of `mask_row`: the prefix, and the block rows its mask allows.
__device__ __forceinline__ bool row_visible(const SplitRows& rows, const bool* mask_row, int u) {
  return u < rows.end && (u < rows.prefix || mask_row[u - rows.prefix]);
}

// The cache rows of a tensor-core block (query tile blockIdx.x of q_rows rows, split blockIdx.y, in tiles of
// kv_rows). A split that starts past the visible rows (only with several splits) comes back empty, its query
// rows marked as having seen nothing: (max, sum) = (-inf, 0), which the combine step reads.
template <typename T>
__device__ __forceinline__ SplitRows tile_split_rows(const VerifyAttnArgs<T>& a, int q_rows, int kv_rows) {
  const SplitRows rows = split_rows(a, blockIdx.y, kv_rows);
  if (rows.begin >= rows.end) {
    const int num_rows = a.num_nodes * a.num_heads;
    const int row0 = blockIdx.x * q_rows;
    for (int r = threadIdx.x; r < q_rows && row0 + r < num_rows; r += blockDim.x) {
      store_ml(a, blockIdx.y, row0 + r, neg_inf(), 0.0f);
    }
  }
  return rows;
}

}  // namespace ddtree::cuda
