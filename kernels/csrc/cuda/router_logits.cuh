// The MoE router's float32 logits in one launch (contract: kernels/ops.py): logits [N, E] = x [N, H] times the
// float32 router weight [E, H], transposed, each logit reduced in router_order.h's order (a warp's 32 lanes, then a
// butterfly), so a row's logits are the same bits whatever the call holds, and the CPU kernel's. x stays in its
// dtype: no float32 copy of it first.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ddtree::cuda {

struct RouterLogitsArgs {
  const void* x;       // [N, H], rows at row_stride elements
  int64_t row_stride;
  const float* weight;  // [E, H] contiguous
  float* out;           // [N, E] contiguous
  int num_rows;         // N
  int num_experts;      // E
  int width;            // H
  bool bf16;            // x bfloat16, else float32
};

cudaError_t RouterLogits(const RouterLogitsArgs& args, cudaStream_t stream);

}  // namespace ddtree::cuda
