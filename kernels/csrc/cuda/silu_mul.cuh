// SwiGLU's activation in one launch (contract: kernels/ops.py): out = silu(gate) * up over gate_up [M, 2I]'s two
// halves, silu rounded to the dtype before the product as torch's F.silu(gate) * up rounds it, so out has those two
// kernels' bits where they took two launches and a [M, I] intermediate.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ddtree::cuda {

struct SiluMulArgs {
  const void* gate_up;  // [M, 2I], rows at row_stride elements
  int64_t row_stride;
  void* out;      // [M, I] contiguous
  int num_rows;   // M
  int width;      // I
  bool bf16;      // gate_up and out bfloat16, else float32
};

cudaError_t SiluMul(const SiluMulArgs& args, cudaStream_t stream);

}  // namespace ddtree::cuda
