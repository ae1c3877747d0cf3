// The MoE router's logits on the CPU (contract: kernels/ops.py), in the order router_order.h names: chain l of 32
// sums x[h] * w[h] with fused multiply-adds over its chunks of 4 columns (or its columns, where H is not a multiple
// of 4), and a butterfly folds the 32 sums, as the CUDA kernel's warp does, so both give the same bits.
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <array>
#include <cmath>

#include "../checks.h"
#include "../router_order.h"
#include "cpu_ops.h"

namespace ddtree::cpu {
namespace {

template <typename T>
float router_dot(const T* x, const float* w, int64_t width) {
  std::array<float, kRouterLanes> chains{};
  const bool chunked = width % kRouterChunk == 0;
  const int64_t step = chunked ? kRouterChunk : 1;
  for (int lane = 0; lane < kRouterLanes; ++lane) {
    float sum = 0.0f;
    for (int64_t h = lane * step; h < width; h += kRouterLanes * step) {
      for (int64_t j = h; j < h + step; ++j) sum = std::fma(static_cast<float>(x[j]), w[j], sum);
    }
    chains[lane] = sum;
  }
  for (int offset = kRouterLanes / 2; offset > 0; offset /= 2) {
    std::array<float, kRouterLanes> folded{};
    for (int lane = 0; lane < kRouterLanes; ++lane) folded[lane] = chains[lane] + chains[lane ^ offset];
    chains = folded;
  }
  return chains[0];
}

template <typename T>
void router_rows(const at::Tensor& x, const at::Tensor& weight, at::Tensor& out) {
  const int64_t num_experts = weight.size(0), width = weight.size(1), stride = x.stride(0);
  const T* rows = x.const_data_ptr<T>();
  const float* w = weight.const_data_ptr<float>();
  float* dst = out.mutable_data_ptr<float>();
  at::parallel_for(0, x.size(0) * num_experts, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t n = i / num_experts, e = i % num_experts;
      dst[i] = router_dot(rows + n * stride, w + e * width, width);
    }
  });
}

}  // namespace

at::Tensor router_logits(const at::Tensor& x, const at::Tensor& weight) {
  check_router_logits_args(x, weight);
  at::Tensor out = at::empty({x.size(0), weight.size(0)}, x.options().dtype(at::kFloat));
  if (x.scalar_type() == at::kFloat) {
    router_rows<float>(x, weight, out);
  } else {
    router_rows<c10::BFloat16>(x, weight, out);
  }
  return out;
}

}  // namespace ddtree::cpu
