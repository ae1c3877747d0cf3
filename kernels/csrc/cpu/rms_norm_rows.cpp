// The row-invariant RMSNorm on the CPU (contract: kernels/ops.py): every row's sum of squares one float32 chain in
// column order (row_norm.h, shared with latent_write), rows spread over threads whole.
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include "../checks.h"
#include "cpu_ops.h"
#include "row_norm.h"

namespace ddtree::cpu {
namespace {

template <typename T, typename W>
void norm_rows(const at::Tensor& x, const at::Tensor& weight, float eps, at::Tensor& y) {
  const int64_t num_rows = x.size(0), width = x.size(1), stride = x.stride(0);
  const T* src = x.const_data_ptr<T>();
  const W* w = weight.const_data_ptr<W>();
  T* dst = y.mutable_data_ptr<T>();
  at::parallel_for(0, num_rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) rms_norm_row(src + m * stride, w, width, eps, dst + m * width);
  });
}

}  // namespace

at::Tensor rms_norm_rows(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rms_norm_rows_args(x, weight, eps);
  at::Tensor y = at::empty(x.sizes(), x.options());
  const auto e = static_cast<float>(eps);
  const bool weight_f32 = weight.scalar_type() == at::kFloat;
  if (x.scalar_type() == at::kFloat) {
    norm_rows<float, float>(x, weight, e, y);
  } else if (weight_f32) {
    norm_rows<c10::BFloat16, float>(x, weight, e, y);
  } else {
    norm_rows<c10::BFloat16, c10::BFloat16>(x, weight, e, y);
  }
  return y;
}

}  // namespace ddtree::cpu
