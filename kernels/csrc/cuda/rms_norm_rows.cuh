// The row-invariant RMSNorm on CUDA (contract: kernels/ops.py): y = x * rsqrt(mean(x^2) + eps) * weight per row, in
// float32, rounded to x's dtype once. A block per row: thread t adds the squares of its columns in order (where D is
// a multiple of a 16-byte vector, those of vectors t, t + 256, ...; else columns t, t + 256, ...), and the block
// folds the 256 sums by a fixed tree (a warp butterfly, then warp 0 over the 8 warps' sums), so a row's bits depend
// on D alone, never on M or the other rows: the batch-invariant mode's norm, in one launch where the float32 ops
// around a matmul against a ones column took ten.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ddtree::cuda {

struct RmsNormRowsArgs {
  const void* x;       // [M, D], rows at row_stride elements
  int64_t row_stride;
  const void* weight;  // [D], x's dtype or float32
  void* y;             // [M, D] contiguous, x's dtype
  int num_rows;        // M
  int width;           // D
  float eps;
  bool bf16;           // x (and y) bfloat16, else float32
  bool weight_f32;     // weight float32, else x's dtype
};

cudaError_t RmsNormRows(const RmsNormRowsArgs& args, cudaStream_t stream);

}  // namespace ddtree::cuda
