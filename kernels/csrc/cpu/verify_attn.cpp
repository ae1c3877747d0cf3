// Absorbed-MLA attention of a block of nodes over the latent cache, on the CPU (contract: kernels/ops.py).
//
// The call is split into units, one node and one group of its heads each (verify_attn_tile.h: how a unit
// runs, and why its results do not depend on the split), which torch's threads take one at a time.
// Nodes are split into head groups only as far as the threads need work. A node's keys are its logical
// sequence (the prefix rows, then its visible block rows in index order), cut into key blocks by logical
// position: a tree node's blocks are then AR's at its position, so every call is batch-invariant and
// batch_invariant=True runs this same kernel, at no cost.
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>

#include <atomic>
#include <type_traits>

#include "../checks.h"
#include "cpu_ops.h"
#include "isa.h"
#include "verify_attn_tile.h"

namespace ddtree::cpu {
namespace {

using attn::kKeyBlock;
using attn::Problem;
using attn::Scratch;
using attn::to_float;

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// dst[c][h] = src[h][c] for h < num_heads and c < dim, zero for num_heads <= h < heads_pad (the padding
// lanes). bfloat16 rows are widened into scratch first.
template <class L, typename T>
DDTREE_ALWAYS_INLINE void transpose_heads(const T* rows, int64_t dim, int64_t num_heads, int64_t heads_pad,
                                          float* dst, float* widened) {
  constexpr int64_t W = L::kWidth;
  const float* src;
  if constexpr (std::is_same_v<T, float>) {
    src = rows;
  } else {
    for (int64_t i = 0; i < num_heads * dim; ++i) widened[i] = to_float(rows[i]);
    src = widened;
  }
  const int64_t full_heads = num_heads / W * W, full_cols = dim / W * W;
  for (int64_t h0 = 0; h0 < full_heads; h0 += W) {
    for (int64_t c0 = 0; c0 < full_cols; c0 += W) {
      simd::transpose_tile<L>(src + h0 * dim + c0, dim, dst + c0 * heads_pad + h0, heads_pad);
    }
  }
  for (int64_t c = 0; c < dim; ++c) {
    const int64_t h_begin = c < full_cols ? full_heads : 0;
    for (int64_t h = h_begin; h < num_heads; ++h) dst[c * heads_pad + h] = src[h * dim + c];
    std::fill(dst + c * heads_pad + num_heads, dst + (c + 1) * heads_pad, 0.0f);
  }
}

// Q^T of the unit, [R + P, heads_pad]: the latent then the rope columns of its heads' queries.
template <class L, typename T>
DDTREE_ALWAYS_INLINE void pack_queries(const Problem<T>& p, int64_t node, int64_t head0, int64_t num_heads,
                                       int64_t heads_pad, Scratch& s) {
  const int64_t row0 = node * p.num_heads + head0;
  transpose_heads<L>(p.q_lat + row0 * p.lat_dim, p.lat_dim, num_heads, heads_pad, s.queries.data(),
                     s.widened.data());
  transpose_heads<L>(p.q_pe + row0 * p.rope_dim, p.rope_dim, num_heads, heads_pad,
                     s.queries.data() + p.lat_dim * heads_pad, s.widened.data());
}

// The node's visible block rows prefix_len + j (block_mask[node, j]), in index order; returns how many. For a
// tree node these are its ancestors and itself, at logical positions prefix_len, prefix_len + 1, ...
template <typename T>
DDTREE_ALWAYS_INLINE int64_t visible_block_rows(const Problem<T>& p, int64_t node, int64_t* rows) {
  const bool* mask_row = p.mask + node * p.num_nodes;
  int64_t n = 0;
  for (int64_t j = 0; j < p.num_nodes; ++j) {
    if (mask_row[j]) rows[n++] = p.prefix_len + j;
  }
  return n;
}

// The cache rows of the node's logical positions [b0, min(b0 + kKeyBlock, end)): the prefix rows are their
// own positions, position prefix_len + k is the node's k-th visible block row; returns how many.
template <typename T>
DDTREE_ALWAYS_INLINE int64_t logical_rows(const Problem<T>& p, int64_t b0, int64_t end, const int64_t* block_rows,
                                          int64_t* rows) {
  const int64_t stop = std::min(b0 + kKeyBlock, end);
  int64_t n = 0;
  for (int64_t u = b0; u < std::min(stop, p.prefix_len); ++u) rows[n++] = u;
  for (int64_t u = std::max(b0, p.prefix_len); u < stop; ++u) rows[n++] = block_rows[u - p.prefix_len];
  return n;
}

// Float32 pointers to the n rows' latent and rope parts (widened into scratch when copy_keys), then
// max_tile_keys more copies of the last, so that every tile reads n rounded up to its size.
template <typename T>
DDTREE_ALWAYS_INLINE void key_rows(const Problem<T>& p, const int64_t* rows, int64_t n, int64_t max_tile_keys,
                                   Scratch& s) {
  if (p.copy_keys) {
    const int64_t stride = p.lat_pad + p.rope_dim;
    for (int64_t j = 0; j < n; ++j) {
      float* dst = s.keys.data() + j * stride;
      const T* lat = p.ckv + rows[j] * p.lat_dim;
      const T* rope = p.kpe + rows[j] * p.rope_dim;
      for (int64_t r = 0; r < p.lat_dim; ++r) dst[r] = to_float(lat[r]);
      std::fill(dst + p.lat_dim, dst + p.lat_pad, 0.0f);
      for (int64_t r = 0; r < p.rope_dim; ++r) dst[p.lat_pad + r] = to_float(rope[r]);
      s.lat_rows[j] = dst;
      s.pe_rows[j] = dst + p.lat_pad;
    }
  } else if constexpr (std::is_same_v<T, float>) {
    for (int64_t j = 0; j < n; ++j) {
      s.lat_rows[j] = p.ckv + rows[j] * p.lat_dim;
      s.pe_rows[j] = p.kpe + rows[j] * p.rope_dim;
    }
  }
  std::fill(s.lat_rows.begin() + n, s.lat_rows.begin() + n + max_tile_keys, s.lat_rows[n - 1]);
  std::fill(s.pe_rows.begin() + n, s.pe_rows.begin() + n + max_tile_keys, s.pe_rows[n - 1]);
}

// o_lat = acc / sum and lse = max + log(sum) for the unit's heads; a head that saw no row gets 0 and -inf.
template <typename T>
DDTREE_ALWAYS_INLINE void write_outputs(const Problem<T>& p, int64_t node, int64_t head0, int64_t num_heads,
                                        const Scratch& s) {
  for (int64_t h = 0; h < num_heads; ++h) {
    const int64_t row = node * p.num_heads + head0 + h;
    T* out = p.o_lat + row * p.lat_dim;
    const float sum = s.sum[h];
    if (sum == 0.0f) {
      std::fill(out, out + p.lat_dim, static_cast<T>(0.0f));
      p.lse[row] = -std::numeric_limits<float>::infinity();
      continue;
    }
    const float inv_sum = 1.0f / sum;
    const float* acc = s.acc.data() + h * p.lat_pad;
    for (int64_t r = 0; r < p.lat_dim; ++r) out[r] = static_cast<T>(acc[r] * inv_sum);
    p.lse[row] = s.max[h] + std::log(sum);
  }
}

template <class C>
constexpr int64_t width() {
  return C::L::kWidth;
}

// Head vectors [v0, v1) of unit `group`: the groups split the node's ceil(H / W) head vectors evenly.
struct HeadRange {
  int64_t v0, v1;
};
inline HeadRange head_range(int64_t group, int64_t num_groups, int64_t num_vecs) {
  return {group * num_vecs / num_groups, (group + 1) * num_vecs / num_groups};
}

template <class C, typename T>
DDTREE_ALWAYS_INLINE void attend_unit(const Problem<T>& p, int64_t unit, Scratch& s) {
  constexpr int64_t W = width<C>();
  const int64_t node = unit / p.num_groups;
  const HeadRange vecs = head_range(unit % p.num_groups, p.num_groups, ceil_div(p.num_heads, W));
  const int64_t head0 = vecs.v0 * W, num_heads = std::min(vecs.v1 * W, p.num_heads) - head0;
  const int64_t num_vecs = vecs.v1 - vecs.v0, heads_pad = num_vecs * W, lat_vecs = p.lat_pad / W;
  pack_queries<typename C::L>(p, node, head0, num_heads, heads_pad, s);
  std::fill(s.max.data(), s.max.data() + heads_pad, -std::numeric_limits<float>::infinity());
  std::fill(s.sum.data(), s.sum.data() + heads_pad, 0.0f);
  std::fill(s.acc.data(), s.acc.data() + heads_pad * p.lat_pad, 0.0f);
  const int64_t end = p.prefix_len + visible_block_rows(p, node, s.block_rows.data());
  for (int64_t b0 = 0; b0 < end; b0 += kKeyBlock) {
    const int64_t n = logical_rows(p, b0, end, s.block_rows.data(), s.rows.data());
    key_rows(p, s.rows.data(), n, C::kMaxTileKeys, s);
    attn::qk_block<C>(s.queries.data(), heads_pad, num_vecs, s.lat_rows.data(), s.pe_rows.data(), n, p.lat_dim,
                      p.rope_dim, p.scale, s.scores.data());
    attn::softmax_block<typename C::L>(s.scores.data(), heads_pad, n, s.max.data(), s.sum.data(), s.rescale.data());
    for (int64_t v = 0; v < lat_vecs; v += C::kPvVecs) {
      attn::pv_cols<C, C::kPvVecs>(s.scores.data(), heads_pad, s.lat_rows.data(), n, v * W,
                                   std::min<int64_t>(C::kPvVecs, lat_vecs - v), s.rescale.data(), s.acc.data(),
                                   p.lat_pad);
    }
  }
  write_outputs(p, node, head0, num_heads, s);
}

// Takes units from `next` until none is left: a thread that the OS holds back delays only the unit it holds.
template <class C, typename T>
DDTREE_ALWAYS_INLINE void attend_units(const Problem<T>& p, std::atomic<int64_t>& next) {
  const int64_t max_heads = ceil_div(ceil_div(p.num_heads, width<C>()), p.num_groups) * width<C>();
  Scratch s(max_heads, p.lat_pad, p.rope_dim, C::kMaxTileKeys, p.copy_keys, p.num_nodes);
  const int64_t num_units = p.num_nodes * p.num_groups;
  for (int64_t unit = next++; unit < num_units; unit = next++) attend_unit<C>(p, unit, s);
}

// One compiled copy of the kernel per instruction set (simd.h).
template <typename T>
using UnitsFn = void (*)(const Problem<T>&, std::atomic<int64_t>&);

#ifdef DDTREE_X86_64
template <typename T>
DDTREE_TARGET_AVX512 void attend_units_avx512(const Problem<T>& p, std::atomic<int64_t>& next) {
  attend_units<attn::Avx512Config>(p, next);
}
template <typename T>
DDTREE_TARGET_AVX2 void attend_units_avx2(const Problem<T>& p, std::atomic<int64_t>& next) {
  attend_units<attn::Avx2Config>(p, next);
}
#endif
template <typename T>
void attend_units_generic(const Problem<T>& p, std::atomic<int64_t>& next) {
  attend_units<attn::GenericConfig>(p, next);
}

// Head groups per node: as few as keep a unit within kMaxUnitHeads, more only while the threads would get
// unequal shares of few units.
int64_t num_head_groups(int64_t num_nodes, int64_t num_vecs, int64_t width, int64_t num_threads) {
  int64_t groups = ceil_div(num_vecs, ceil_div(attn::kMaxUnitHeads, width));
  while (groups < num_vecs && num_nodes * groups < 8 * num_threads && (num_nodes * groups) % num_threads != 0) {
    ++groups;
  }
  return groups;
}

template <typename T>
void run(const at::Tensor& q_lat, const at::Tensor& q_pe, const at::Tensor& ckv, const at::Tensor& kpe,
         const at::Tensor& block_mask, int64_t prefix, float scale, at::Tensor& o_lat, at::Tensor& lse) {
  const Isa isa = chosen_isa();
  UnitsFn<T> units = attend_units_generic<T>;
  int64_t w = width<attn::GenericConfig>();
#ifdef DDTREE_X86_64
  if (isa == Isa::kAvx512) units = attend_units_avx512<T>, w = width<attn::Avx512Config>();
  if (isa == Isa::kAvx2) units = attend_units_avx2<T>, w = width<attn::Avx2Config>();
#endif
  Problem<T> p{q_lat.const_data_ptr<T>(), q_pe.const_data_ptr<T>(), ckv.const_data_ptr<T>(),
               kpe.const_data_ptr<T>(), block_mask.const_data_ptr<bool>(), o_lat.mutable_data_ptr<T>(),
               lse.mutable_data_ptr<float>(), q_lat.size(0), q_lat.size(1), q_lat.size(2), q_pe.size(2), prefix,
               scale, 1, 0, false};
  p.num_groups = num_head_groups(p.num_nodes, ceil_div(p.num_heads, w), w, at::get_num_threads());
  p.lat_pad = ceil_div(p.lat_dim, w) * w;
  p.copy_keys = !std::is_same_v<T, float> || p.lat_dim % w != 0;
  std::atomic<int64_t> next{0};
  const int64_t num_workers = std::min<int64_t>(at::get_num_threads(), p.num_nodes * p.num_groups);
  at::parallel_for(0, num_workers, 1, [&](int64_t, int64_t) { units(p, next); });
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> verify_attn(const at::Tensor& q_lat, const at::Tensor& q_pe, const at::Tensor& ckv,
                                               const at::Tensor& kpe, const at::Tensor& prefix_len,
                                               const at::Tensor& block_mask, double scale, bool batch_invariant) {
  check_verify_attn_args(q_lat, q_pe, ckv, kpe, prefix_len, block_mask);
  const int64_t num_nodes = q_lat.size(0);
  const int64_t cache_rows = ckv.size(0);
  const int64_t prefix = *prefix_len.const_data_ptr<int64_t>();
  TORCH_CHECK(prefix >= 0, "prefix_len must be >= 0, got ", prefix);
  TORCH_CHECK(prefix + num_nodes <= cache_rows, "prefix_len + N must be <= S (the block's rows follow the prefix in ",
              "the cache), got prefix_len = ", prefix, ", N = ", num_nodes, ", S = ", cache_rows);
  at::Tensor o_lat = at::empty_like(q_lat);
  at::Tensor lse = at::empty({num_nodes, q_lat.size(1)}, q_lat.options().dtype(at::kFloat));
  if (lse.numel() == 0) return {o_lat, lse};  // N = 0 or H = 0
  (void)batch_invariant;  // every call is: verify_attn_tile.h
  if (q_lat.scalar_type() == at::kFloat) {
    run<float>(q_lat, q_pe, ckv, kpe, block_mask, prefix, static_cast<float>(scale), o_lat, lse);
  } else {
    run<c10::BFloat16>(q_lat, q_pe, ckv, kpe, block_mask, prefix, static_cast<float>(scale), o_lat, lse);
  }
  return {o_lat, lse};
}

}  // namespace ddtree::cpu
