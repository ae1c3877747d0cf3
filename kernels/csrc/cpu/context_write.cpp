// The DFlash drafter's context cache write on the CPU (contract: kernels/ops.py): each key head normed and turned by
// head_norm_rope's own per-head code (row_norm.h), each value head copied, into the cache rows start .. start + n - 1.
#include <ATen/Parallel.h>

#include <algorithm>

#include "../checks.h"
#include "cpu_ops.h"
#include "row_norm.h"

namespace ddtree::cpu {
namespace {

template <typename T, typename W>
void write_heads(const at::Tensor& kv, const at::Tensor& k_norm, const at::Tensor& rope, int64_t start, float eps,
                 const at::Tensor& keys, const at::Tensor& values) {
  const int64_t num_rows = kv.size(0), cache_rows = keys.size(1), num_kv_heads = keys.size(2), dim = keys.size(3);
  const int64_t groups = keys.size(0) * num_kv_heads, half = dim / 2, angles = rope.size(1);
  const int64_t kv_stride = kv.stride(0);
  const T* src = kv.const_data_ptr<T>();
  const W* weight = k_norm.const_data_ptr<W>();
  const float* cos = rope.const_data_ptr<float>();
  const float* sin = cos + angles * half;
  T* key_cache = keys.mutable_data_ptr<T>();
  T* value_cache = values.mutable_data_ptr<T>();
  at::parallel_for(0, num_rows * groups, 64, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t i = item / groups, g = item % groups, position = start + i;
      const int64_t layer = g / num_kv_heads, head = g % num_kv_heads;
      const int64_t dst = ((layer * cache_rows + position) * num_kv_heads + head) * dim;
      const T* row = src + i * kv_stride;
      norm_rope_head<T, W>(row + g * dim, weight + g * dim, cos + position * half, sin + position * half, dim, eps,
                           false, key_cache + dst);
      std::copy_n(row + (groups + g) * dim, dim, value_cache + dst);
    }
  });
}

}  // namespace

void context_write(const at::Tensor& kv, const at::Tensor& k_norm, const at::Tensor& rope, const at::Tensor& start,
                   double eps, const at::Tensor& keys, const at::Tensor& values) {
  check_context_write_args(kv, k_norm, rope, start, eps, keys, values);
  const int64_t first = start.item<int64_t>(), num_rows = kv.size(0);
  const int64_t limit = std::min(keys.size(1), rope.size(1));
  TORCH_CHECK(first >= 0 && first + num_rows <= limit, "the positions start .. start + n - 1 = ", first, " .. ",
              first + num_rows - 1, " must lie in [0, ", limit, "): the cache holds S = ", keys.size(1),
              " rows (keys.size(1)) and rope the angles of P = ", rope.size(1), " positions (rope.size(1))");
  const auto e = static_cast<float>(eps);
  if (kv.scalar_type() == at::kFloat) {
    write_heads<float, float>(kv, k_norm, rope, first, e, keys, values);
  } else if (k_norm.scalar_type() == at::kFloat) {
    write_heads<c10::BFloat16, float>(kv, k_norm, rope, first, e, keys, values);
  } else {
    write_heads<c10::BFloat16, c10::BFloat16>(kv, k_norm, rope, first, e, keys, values);
  }
}

}  // namespace ddtree::cpu
