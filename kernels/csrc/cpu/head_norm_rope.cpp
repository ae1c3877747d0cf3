// head_norm_rope on the CPU (contract: kernels/ops.py): each (row, head) one float32 pass for its sum of squares in
// column order (none without a weight), then its rotated pairs (row_norm.h, shared with latent_write), rows spread
// over threads.
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include "../checks.h"
#include "cpu_ops.h"
#include "row_norm.h"

namespace ddtree::cpu {
namespace {

template <typename T, typename W>
void norm_rope(const at::Tensor& x, const W* w, const at::Tensor& cos, const at::Tensor& sin, float eps,
               bool interleave, at::Tensor& y) {
  const int64_t num_heads = x.size(1), dim = x.size(2), half = dim / 2;
  const int64_t row_stride = x.stride(0), head_stride = x.stride(1);
  const T* src = x.const_data_ptr<T>();
  const float* c = cos.const_data_ptr<float>();
  const float* s = sin.const_data_ptr<float>();
  T* dst = y.mutable_data_ptr<T>();
  at::parallel_for(0, x.size(0) * num_heads, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t m = i / num_heads, h = i % num_heads;
      norm_rope_head(src + m * row_stride + h * head_stride, w == nullptr ? nullptr : w + h * dim, c + m * half,
                     s + m * half, dim, eps, interleave, dst + i * dim);
    }
  });
}

template <typename T>
void norm_rope(const at::Tensor& x, const std::optional<at::Tensor>& weight, const at::Tensor& cos,
               const at::Tensor& sin, float eps, bool interleave, at::Tensor& y) {
  if (!weight.has_value()) {
    norm_rope<T, float>(x, nullptr, cos, sin, eps, interleave, y);
  } else if (weight->scalar_type() == at::kFloat) {
    norm_rope<T, float>(x, weight->const_data_ptr<float>(), cos, sin, eps, interleave, y);
  } else {
    norm_rope<T, T>(x, weight->const_data_ptr<T>(), cos, sin, eps, interleave, y);
  }
}

}  // namespace

at::Tensor head_norm_rope(const at::Tensor& x, const std::optional<at::Tensor>& weight, const at::Tensor& cos,
                          const at::Tensor& sin, double eps, bool interleave) {
  check_head_norm_rope_args(x, weight, cos, sin, eps);
  at::Tensor y = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  const auto e = static_cast<float>(eps);
  if (x.scalar_type() == at::kFloat) {
    norm_rope<float>(x, weight, cos, sin, e, interleave, y);
  } else {
    norm_rope<c10::BFloat16>(x, weight, cos, sin, e, interleave, y);
  }
  return y;
}

}  // namespace ddtree::cpu
