// head_norm_rope on CUDA (contract: kernels/ops.py): each head's RMSNorm (without a weight: none) and then its
// rotate-half RoPE, in float32, rounded once. A warp per (row, head): lane l holds the pairs (j, j + D/2) (interleaved:
// (2j, 2j + 1)) for j = l, l + 32, ..., sums their squares, and after one warp reduction writes the rotated pairs:
// one launch where torch's norm and RoPE take five, and the RoPE alone four.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ddtree::cuda {

constexpr int kHeadNormRopeMaxDim = 512;  // 8 pairs a lane

struct HeadNormRopeArgs {
  const void* x;       // [M, H, D], each head contiguous, rows row_stride and heads head_stride elements apart
  int64_t row_stride;
  int64_t head_stride;
  const void* weight;  // [H, D], x's dtype or float32; nullptr: no norm
  const float* cos;    // [M, D/2]
  const float* sin;    // [M, D/2]
  void* y;             // [M, H, D] contiguous, x's dtype
  int num_rows;        // M
  int num_heads;       // H
  int head_dim;        // D
  float eps;
  bool bf16;           // x (and y) bfloat16, else float32
  bool weight_f32;     // weight float32, else x's dtype
  bool interleave;     // pair j is (2j, 2j + 1), else (j, j + D/2)
};

cudaError_t HeadNormRope(const HeadNormRopeArgs& args, cudaStream_t stream);

}  // namespace ddtree::cuda
