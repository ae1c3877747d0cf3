// verify_attn on the CPU for one unit of work: one node and a group of its heads, over the whole cache.
//
// A node's keys are its logical sequence: the prefix rows 0 .. prefix_len - 1, then the block rows its mask
// allows in index order (for a tree node its ancestors and itself: positions prefix_len, prefix_len + 1, ..., as
// AR holds them after kv_compact). They are taken in fixed blocks of kKeyBlock logical positions starting at
// position 0, and a block's rows are processed together for every head of the unit, so each cache row is
// read once per unit, not once per head:
//   scores [keys, heads] = K Q^T over R + P (heads in vector lanes, each key's value broadcast), then
//   the running max, exp and sum per head (an online softmax, one rescale per block), then
//   acc [heads, R] = acc * rescale + P^T V (the R columns in vector lanes, each weight broadcast).
// Every score is one float32 sum in order r = 0 .. R + P - 1, every acc element a sum in key order inside
// the block, and blocks combine in position order. None of that depends on N, on the heads of the unit, on
// the tile a value lands in, on the cache slots of the rows or on the threads, so a node's result is the same
// bits whatever else is in the call, and a tree node's are AR's at its position (on one machine and
// instruction set: the FMA path rounds differently from the generic one).
#pragma once

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "simd.h"

namespace ddtree::cpu::attn {

constexpr int64_t kKeyBlock = 64;     // logical positions per key block; blocks start at position 0
constexpr int64_t kMaxUnitHeads = 64;  // heads per unit at most (its queries and accumulators stay in L2)
constexpr int64_t kQkColumns = 64;     // query columns per pass over a block's keys

// Tile shapes per instruction set: about 24 vector accumulators with 32 registers, 12 with 16.
// QK: keys_per_tile(NV) keys x NV head vectors; PV: kPvHeads heads x kPvVecs vectors of R.
struct Avx512Config {
  using L = simd::Lanes<16>;
  static constexpr int kQkVecs = 4, kPvHeads = 8, kPvVecs = 3, kMaxTileKeys = 16;
  static constexpr int keys_per_tile(int nv) { return nv == 4 ? 6 : nv >= 2 ? 8 : 16; }
};
struct Avx2Config {
  using L = simd::Lanes<8>;
  static constexpr int kQkVecs = 3, kPvHeads = 4, kPvVecs = 3, kMaxTileKeys = 8;
  static constexpr int keys_per_tile(int nv) { return nv == 3 ? 3 : nv == 2 ? 4 : 8; }
};
struct GenericConfig : Avx2Config {
  using L = simd::Lanes<4>;
};

template <typename T>
struct Problem {
  const T* q_lat;     // [N, H, R]
  const T* q_pe;      // [N, H, P]
  const T* ckv;       // [S, R]
  const T* kpe;       // [S, P]
  const bool* mask;   // [N, N]
  T* o_lat;           // [N, H, R]
  float* lse;         // [N, H]
  int64_t num_nodes, num_heads, lat_dim, rope_dim, prefix_len;
  float scale;
  int64_t num_groups;  // head groups per node: unit u is node u / num_groups, group u % num_groups
  int64_t lat_pad;     // R rounded up to the vector width: the accumulator's row length
  bool copy_keys;      // widen each block's rows into float32 scratch (bfloat16, or R not a multiple of the width)
};

// Uninitialised floats starting on a cache line, so that no vector load straddles two lines.
class LineAligned {
 public:
  explicit LineAligned(int64_t size) : storage_(new float[size + kLineFloats]) {
    const auto address = reinterpret_cast<uintptr_t>(storage_.get());
    data_ = storage_.get() + (kLineFloats - address / sizeof(float) % kLineFloats) % kLineFloats;
  }
  float* data() { return data_; }
  const float* data() const { return data_; }
  float operator[](int64_t i) const { return data_[i]; }

 private:
  static constexpr int64_t kLineFloats = 64 / sizeof(float);
  std::unique_ptr<float[]> storage_;
  float* data_;
};

// One thread's scratch, reused for every unit it runs.
struct Scratch {
  LineAligned queries, widened, scores, acc, keys, max, sum, rescale;
  std::vector<int64_t> rows, block_rows;
  std::vector<const float*> lat_rows, pe_rows;

  Scratch(int64_t max_heads, int64_t lat_pad, int64_t rope_dim, int64_t max_tile_keys, bool copy_keys,
          int64_t num_nodes)
      : queries((lat_pad + rope_dim) * max_heads),
        widened(copy_keys ? (lat_pad + rope_dim) * max_heads : 0),
        scores((kKeyBlock + max_tile_keys) * max_heads),
        acc(max_heads * lat_pad),
        keys(copy_keys ? kKeyBlock * (lat_pad + rope_dim) : 0),
        max(max_heads),
        sum(max_heads),
        rescale(max_heads),
        rows(kKeyBlock),
        block_rows(num_nodes),
        lat_rows(kKeyBlock + max_tile_keys),
        pe_rows(kKeyBlock + max_tile_keys) {}
};

DDTREE_ALWAYS_INLINE float to_float(float x) { return x; }
DDTREE_ALWAYS_INLINE float to_float(c10::BFloat16 x) {
  const uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// scores[j][v*W + lane] += q . k_j over `len` columns for MK keys and NV head vectors (columns col .. col +
// len - 1 of the queries and of each row): `first` starts the sums at 0, and the sums are stored times
// out_scale (1 until the last columns). Each score is one float32 sum in column order.
template <class L, int MK, int NV>
DDTREE_ALWAYS_INLINE void qk_tile(const float* queries, int64_t heads_pad, const float* const* rows, int64_t col,
                                  int64_t len, bool first, float out_scale, float* scores) {
  using F = typename L::F;
  constexpr int W = L::kWidth;
  F acc[MK][NV];
  for (int j = 0; j < MK; ++j) {
    for (int v = 0; v < NV; ++v) acc[j][v] = first ? F{} : simd::load<L>(scores + j * heads_pad + v * W);
  }
  const float* key[MK];
  for (int j = 0; j < MK; ++j) key[j] = rows[j] + col;
  for (int64_t r = 0; r < len; ++r) {
    F qv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) qv[v] = simd::load<L>(queries + r * heads_pad + v * W);
#pragma GCC unroll 16
    for (int j = 0; j < MK; ++j) {
      const float k = key[j][r];
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[j][v] += qv[v] * k;
    }
  }
  for (int j = 0; j < MK; ++j) {
    for (int v = 0; v < NV; ++v) simd::store<L>(scores + j * heads_pad + v * W, acc[j][v] * out_scale);
  }
}

// The block's scores for head vectors [v0, v0 + nv) over columns [col, col + len) of one part (latent or
// rope); the key list is padded (with its last row) to a whole tile, the extra scores land past num_keys and
// are never read.
template <class C, int NV>
DDTREE_ALWAYS_INLINE void qk_vecs(const float* queries, int64_t heads_pad, int64_t v0, int64_t nv,
                                  const float* const* rows, int64_t num_keys, int64_t col, int64_t len, bool first,
                                  float out_scale, float* scores) {
  constexpr int W = C::L::kWidth;
  if constexpr (NV > 1) {
    if (nv < NV) {
      return qk_vecs<C, NV - 1>(queries, heads_pad, v0, nv, rows, num_keys, col, len, first, out_scale, scores);
    }
  }
  constexpr int MK = C::keys_per_tile(NV);
  for (int64_t j = 0; j < num_keys; j += MK) {
    qk_tile<typename C::L, MK, NV>(queries + v0 * W, heads_pad, rows + j, col, len, first, out_scale,
                                   scores + j * heads_pad + v0 * W);
  }
}

// scores [num_keys, heads_pad] = scale * (queries^T . keys) over the R latent then P rope columns, in chunks
// of kQkColumns columns so that a chunk of the queries stays in L1 across the block's keys.
template <class C>
DDTREE_ALWAYS_INLINE void qk_block(const float* queries, int64_t heads_pad, int64_t num_vecs,
                                   const float* const* lat_rows, const float* const* pe_rows, int64_t num_keys,
                                   int64_t lat_dim, int64_t rope_dim, float scale, float* scores) {
  const int64_t total = lat_dim + rope_dim;
  int64_t c = 0;
  do {  // at least once, so that R + P = 0 gives zero scores
    const int64_t end = std::min(c + kQkColumns, c < lat_dim ? lat_dim : total);
    const bool lat = c < lat_dim;
    const float out_scale = end == total ? scale : 1.0f;
    for (int64_t v = 0; v < num_vecs; v += C::kQkVecs) {
      qk_vecs<C, C::kQkVecs>(queries + c * heads_pad, heads_pad, v, std::min<int64_t>(C::kQkVecs, num_vecs - v),
                             lat ? lat_rows : pe_rows, num_keys, lat ? c : c - lat_dim, end - c, c == 0, out_scale,
                             scores);
    }
    c = end;
  } while (c < total);
}

// Online softmax over one block, per head lane: new max, rescale = exp(old max - new max), scores become
// exp(score - new max), sum = sum * rescale + the block's sum in key order.
template <class L>
DDTREE_ALWAYS_INLINE void softmax_block(float* scores, int64_t heads_pad, int64_t num_keys, float* max, float* sum,
                                        float* rescale) {
  using F = typename L::F;
  constexpr int W = L::kWidth;
  for (int64_t h = 0; h < heads_pad; h += W) {
    F block_max = simd::splat<L>(-std::numeric_limits<float>::infinity());
    for (int64_t j = 0; j < num_keys; ++j) {
      block_max = simd::max<L>(block_max, simd::load<L>(scores + j * heads_pad + h));
    }
    const F old_max = simd::load<L>(max + h);
    const F new_max = simd::max<L>(old_max, block_max);
    const F alpha = simd::exp_nonpositive<L>(old_max - new_max);
    F block_sum{};
    for (int64_t j = 0; j < num_keys; ++j) {
      const F p = simd::exp_nonpositive<L>(simd::load<L>(scores + j * heads_pad + h) - new_max);
      simd::store<L>(scores + j * heads_pad + h, p);
      block_sum += p;
    }
    simd::store<L>(max + h, new_max);
    simd::store<L>(sum + h, simd::load<L>(sum + h) * alpha + block_sum);
    simd::store<L>(rescale + h, alpha);
  }
}

// acc[h][r] = acc[h][r] * rescale[h] + sum over the block's keys j of p[j][h] * v_j[r], for MH heads and
// RV vectors of r starting at r0.
template <class L, int MH, int RV>
DDTREE_ALWAYS_INLINE void pv_tile(const float* probs, int64_t heads_pad, const float* const* rows, int64_t num_keys,
                                  int64_t r0, const float* rescale, float* acc, int64_t lat_pad) {
  using F = typename L::F;
  constexpr int W = L::kWidth;
  F out[MH][RV];
  for (int h = 0; h < MH; ++h) {
    for (int v = 0; v < RV; ++v) out[h][v] = simd::load<L>(acc + h * lat_pad + r0 + v * W) * rescale[h];
  }
  for (int64_t j = 0; j < num_keys; ++j) {
    F vals[RV];
#pragma GCC unroll 8
    for (int v = 0; v < RV; ++v) vals[v] = simd::load<L>(rows[j] + r0 + v * W);
#pragma GCC unroll 16
    for (int h = 0; h < MH; ++h) {
      const float p = probs[j * heads_pad + h];
#pragma GCC unroll 8
      for (int v = 0; v < RV; ++v) out[h][v] += vals[v] * p;
    }
  }
  for (int h = 0; h < MH; ++h) {
    for (int v = 0; v < RV; ++v) simd::store<L>(acc + h * lat_pad + r0 + v * W, out[h][v]);
  }
}

template <class C, int RV>
DDTREE_ALWAYS_INLINE void pv_cols(const float* probs, int64_t heads_pad, const float* const* rows, int64_t num_keys,
                                  int64_t r0, int64_t num_vecs, const float* rescale, float* acc, int64_t lat_pad) {
  if constexpr (RV > 1) {
    if (num_vecs < RV) return pv_cols<C, RV - 1>(probs, heads_pad, rows, num_keys, r0, num_vecs, rescale, acc, lat_pad);
  }
  for (int64_t h = 0; h < heads_pad; h += C::kPvHeads) {  // the V slice stays in L1 across the heads
    pv_tile<typename C::L, C::kPvHeads, RV>(probs + h, heads_pad, rows, num_keys, r0, rescale + h,
                                            acc + h * lat_pad, lat_pad);
  }
}

}  // namespace ddtree::cpu::attn
