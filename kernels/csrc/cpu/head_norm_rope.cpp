// head_norm_rope on the CPU (contract: kernels/ops.py): each (row, head) one float32 pass for its sum of squares in
// column order (none without a weight), then its rotated pairs, rows spread over threads.
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <cmath>

#include "../checks.h"
#include "cpu_ops.h"

namespace ddtree::cpu {
namespace {

template <typename T, typename W>
void norm_rope(const at::Tensor& x, const W* w, const at::Tensor& cos, const at::Tensor& sin, float eps,
               bool interleave, at::Tensor& y) {
  const int64_t num_heads = x.size(1), dim = x.size(2), half = dim / 2;
  const int64_t row_stride = x.stride(0), head_stride = x.stride(1);
  // where pair j's two values sit in a head: j and j + D/2, or 2j and 2j + 1 (the interleaved layout)
  const int64_t pair_step = interleave ? 2 : 1, partner = interleave ? 1 : half;
  const T* src = x.const_data_ptr<T>();
  const float* c = cos.const_data_ptr<float>();
  const float* s = sin.const_data_ptr<float>();
  T* dst = y.mutable_data_ptr<T>();
  at::parallel_for(0, x.size(0) * num_heads, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t m = i / num_heads, h = i % num_heads;
      const T* head = src + m * row_stride + h * head_stride;
      float scale = 1.0f;
      if (w != nullptr) {
        float squares = 0.0f;
        for (int64_t d = 0; d < dim; ++d) {
          const float v = static_cast<float>(head[d]);
          squares += v * v;
        }
        scale = 1.0f / std::sqrt(squares / static_cast<float>(dim) + eps);
      }
      const W* hw = w == nullptr ? nullptr : w + h * dim;
      for (int64_t j = 0; j < half; ++j) {
        const int64_t first = j * pair_step, second = first + partner;
        float u = static_cast<float>(head[first]), v = static_cast<float>(head[second]);
        if (hw != nullptr) {
          u = u * scale * static_cast<float>(hw[first]);
          v = v * scale * static_cast<float>(hw[second]);
        }
        const float cj = c[m * half + j], sj = s[m * half + j];
        dst[i * dim + j] = static_cast<T>(u * cj - v * sj);
        dst[i * dim + j + half] = static_cast<T>(v * cj + u * sj);
      }
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
