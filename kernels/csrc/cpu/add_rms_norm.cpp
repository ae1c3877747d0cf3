// The residual add and RMSNorm on the CPU (contract: kernels/ops.py): each row's sum rounded to x's dtype, then that
// row normed by rms_norm_rows' own code (row_norm.h), rows spread over threads whole.
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include "../checks.h"
#include "cpu_ops.h"
#include "row_norm.h"

namespace ddtree::cpu {
namespace {

template <typename T, typename W>
void add_norm_rows(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight, float eps, at::Tensor& sum,
                   at::Tensor& y) {
  const int64_t width = x.size(1), x_stride = x.stride(0), delta_stride = delta.stride(0);
  const T* a = x.const_data_ptr<T>();
  const T* b = delta.const_data_ptr<T>();
  const W* w = weight.const_data_ptr<W>();
  T* total = sum.mutable_data_ptr<T>();
  T* out = y.mutable_data_ptr<T>();
  at::parallel_for(0, x.size(0), 16, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      T* row = total + m * width;
      for (int64_t d = 0; d < width; ++d) {
        row[d] = static_cast<T>(static_cast<float>(a[m * x_stride + d]) + static_cast<float>(b[m * delta_stride + d]));
      }
      rms_norm_row(row, w, width, eps, out + m * width);
    }
  });
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight,
                                                double eps) {
  check_add_rms_norm_args(x, delta, weight, eps);
  at::Tensor sum = at::empty(x.sizes(), x.options());
  at::Tensor y = at::empty(x.sizes(), x.options());
  const auto e = static_cast<float>(eps);
  if (x.scalar_type() == at::kFloat) {
    add_norm_rows<float, float>(x, delta, weight, e, sum, y);
  } else if (weight.scalar_type() == at::kFloat) {
    add_norm_rows<c10::BFloat16, float>(x, delta, weight, e, sum, y);
  } else {
    add_norm_rows<c10::BFloat16, c10::BFloat16>(x, delta, weight, e, sum, y);
  }
  return {sum, y};
}

}  // namespace ddtree::cpu
