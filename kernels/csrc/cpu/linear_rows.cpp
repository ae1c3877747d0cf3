// A row-invariant matmul on the CPU (contract: kernels/ops.py): out [M, G, N] = x [M, G, K] W_g^T per group g,
// each W_g [N, K] packed once; or, with group_ends, each row of x [M, 1, K] through the W_g whose range holds it.
//
// Every output element is one float32 chain over k = 0 .. K - 1 in order, acc = acc + x[m, k] * W[n, k] from 0,
// computed by one thread (each multiply-add fused or not as the compiler builds tile(), alike for every row count:
// tests/test_linear_rows.py checks a row's bits across calls). Rows are taken kRows at a time and columns a panel
// of kPanel at a time, and a tail of fewer rows runs the same chain, so a row's result does not depend on M, on the
// rows beside it or on the threads: the batch-invariant mode's matmul, where torch's CPU kernel changes its
// reduction with M. The weight is packed by kernels.ops.pack_linear_rows into panels [G, ceil(N / kPanel), K,
// kPanel], zero-padded, so that a panel's row for one k is one contiguous load.
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>

#include "../checks.h"
#include "cpu_ops.h"
#include "isa.h"
#include "simd.h"

namespace ddtree::cpu {
namespace {

constexpr int64_t kPanel = 16;  // output columns per panel (kernels/ops.py LINEAR_ROWS_PANEL)
constexpr int kRows = 6;        // rows per tile: 6 x 16 accumulators (12 AVX2 registers, as BLAS kernels use)

struct Problem {
  const float* x;            // [M, G, K], strides row_stride, group_stride (0 with group_ends), 1
  const float* packed;       // [G, P, K, kPanel]
  const int32_t* group_ends;  // [G] or null (every group takes every row)
  float* out;                // [M, out_groups, N]: out_groups is 1 with group_ends, else G
  int64_t num_rows, num_groups, out_groups, depth, num_cols, num_panels, row_stride, group_stride;

  int64_t row_begin(int64_t g) const { return group_ends == nullptr || g == 0 ? 0 : group_ends[g - 1]; }
  int64_t row_end(int64_t g) const { return group_ends == nullptr ? num_rows : group_ends[g]; }
  int64_t out_group(int64_t g) const { return group_ends == nullptr ? g : 0; }
};

// Rows m0 .. m0 + R - 1 of group g against its panel: the chains over k, then the panel's real columns stored.
template <class L, int R>
DDTREE_ALWAYS_INLINE void tile(const Problem& p, int64_t m0, int64_t g, int64_t panel) {
  using F = typename L::F;
  constexpr int V = kPanel / L::kWidth;
  F acc[R][V];
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < V; ++v) acc[r][v] = F{};
  }
  const float* w = p.packed + (g * p.num_panels + panel) * p.depth * kPanel;
  const float* x = p.x + m0 * p.row_stride + g * p.group_stride;
  for (int64_t k = 0; k < p.depth; ++k) {
    F wk[V];
    for (int v = 0; v < V; ++v) wk[v] = simd::load<L>(w + k * kPanel + v * L::kWidth);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const F xk = simd::splat<L>(x[r * p.row_stride + k]);
      for (int v = 0; v < V; ++v) acc[r][v] = acc[r][v] + xk * wk[v];
    }
  }
  const int64_t n0 = panel * kPanel, cols = std::min<int64_t>(kPanel, p.num_cols - n0);
  for (int r = 0; r < R; ++r) {
    float row[kPanel];
    for (int v = 0; v < V; ++v) simd::store<L>(row + v * L::kWidth, acc[r][v]);
    std::copy(row, row + cols, p.out + ((m0 + r) * p.out_groups + p.out_group(g)) * p.num_cols + n0);
  }
}

template <class L, int R>
DDTREE_ALWAYS_INLINE void tail(const Problem& p, int64_t m0, int64_t g, int64_t panel, int64_t rows) {
  if constexpr (R > 0) {
    if (rows == R) return tile<L, R>(p, m0, g, panel);
    tail<L, R - 1>(p, m0, g, panel, rows);
  }
}

// Every row tile of the (group, panel) pairs [begin, end), numbered group-major.
template <class L>
DDTREE_ALWAYS_INLINE void panels(const Problem& p, int64_t begin, int64_t end) {
  for (int64_t task = begin; task < end; ++task) {
    const int64_t g = task / p.num_panels, panel = task % p.num_panels;
    const int64_t end = p.row_end(g);
    int64_t m0 = p.row_begin(g);
    for (; m0 + kRows <= end; m0 += kRows) tile<L, kRows>(p, m0, g, panel);
    if (m0 < end) tail<L, kRows - 1>(p, m0, g, panel, end - m0);
  }
}

using PanelsFn = void (*)(const Problem&, int64_t, int64_t);

#ifdef DDTREE_X86_64
DDTREE_TARGET_AVX512 void panels_avx512(const Problem& p, int64_t begin, int64_t end) {
  panels<simd::Lanes<16>>(p, begin, end);
}
DDTREE_TARGET_AVX2 void panels_avx2(const Problem& p, int64_t begin, int64_t end) {
  panels<simd::Lanes<8>>(p, begin, end);
}
#endif
void panels_generic(const Problem& p, int64_t begin, int64_t end) { panels<simd::Lanes<4>>(p, begin, end); }

}  // namespace

at::Tensor linear_rows(const at::Tensor& x, const at::Tensor& packed, int64_t out_features,
                       const std::optional<at::Tensor>& group_ends) {
  check_linear_rows_args(x, packed, out_features, group_ends, kPanel);
  const bool grouped = group_ends.has_value();
  const int64_t num_rows = x.size(0), num_groups = packed.size(0), out_groups = x.size(1);
  const int32_t* ends = grouped ? group_ends->const_data_ptr<int32_t>() : nullptr;
  for (int64_t g = 0; grouped && g < num_groups; ++g) {
    const int64_t begin = g == 0 ? 0 : ends[g - 1];
    TORCH_CHECK(begin <= ends[g] && ends[g] <= num_rows && ends[g] >= 0, "group_ends must be non-decreasing in [0, ",
                "M = ", num_rows, "], got ", *group_ends);
  }
  // With group_ends the rows past the last group's end belong to none: zeros.
  at::Tensor out = grouped ? at::zeros({num_rows, 1, out_features}, x.options())
                           : at::empty({num_rows, out_groups, out_features}, x.options());
  if (out.numel() == 0) return out;
  PanelsFn fn = panels_generic;
#ifdef DDTREE_X86_64
  const Isa isa = chosen_isa();
  if (isa == Isa::kAvx512) fn = panels_avx512;
  if (isa == Isa::kAvx2) fn = panels_avx2;
#endif
  const Problem p{x.const_data_ptr<float>(), packed.const_data_ptr<float>(), ends, out.mutable_data_ptr<float>(),
                  num_rows, num_groups, out_groups, x.size(2), out_features, packed.size(1), x.stride(0),
                  grouped ? 0 : x.stride(1)};
  // Threads take whole (group, panel) pairs: every output is one thread's chain. Grain: about 64 k FMAs a task.
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, num_rows * p.depth * kPanel));
  at::parallel_for(0, num_groups * p.num_panels, grain, [&](int64_t begin, int64_t end) { fn(p, begin, end); });
  return out;
}

}  // namespace ddtree::cpu
