// SwiGLU's activation on the CPU (contract: kernels/ops.py): silu(gate) = gate / (1 + e^-gate) in float32, rounded to
// the dtype, times up, rounded again, each element alone; rows spread over threads whole.
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <cmath>

#include "../checks.h"
#include "cpu_ops.h"

namespace ddtree::cpu {
namespace {

template <typename T>
void silu_mul_rows(const at::Tensor& gate_up, at::Tensor& out) {
  const int64_t width = out.size(1), stride = gate_up.stride(0);
  const T* src = gate_up.const_data_ptr<T>();
  T* dst = out.mutable_data_ptr<T>();
  at::parallel_for(0, out.size(0), 16, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      const T* gate = src + m * stride;
      const T* up = gate + width;
      for (int64_t i = 0; i < width; ++i) {
        const float g = static_cast<float>(gate[i]);
        const T silu = static_cast<T>(g / (1.0f + std::exp(-g)));
        dst[m * width + i] = static_cast<T>(static_cast<float>(silu) * static_cast<float>(up[i]));
      }
    }
  });
}

}  // namespace

at::Tensor silu_mul(const at::Tensor& gate_up) {
  check_silu_mul_args(gate_up);
  at::Tensor out = at::empty({gate_up.size(0), gate_up.size(1) / 2}, gate_up.options());
  if (gate_up.scalar_type() == at::kFloat) {
    silu_mul_rows<float>(gate_up, out);
  } else {
    silu_mul_rows<c10::BFloat16>(gate_up, out);
  }
  return out;
}

}  // namespace ddtree::cpu
