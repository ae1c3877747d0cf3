// The residual add and the RMSNorm after it in one launch (contract: kernels/ops.py): sum = x + delta, each element in
// float32 rounded to x's dtype once (torch's add), and y = rms_norm_rows(sum), the same bits (row_norm.cuh: the block
// reads its sum row back in that op's reduction order). The forward's two adds a layer each feed a norm: one launch
// and one pass over the row where the add and the norm took two.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "rms_norm_rows.cuh"

namespace ddtree::cuda {

struct AddRmsNormArgs {
  RmsNormRowsArgs norm;  // x [M, D] (the residual stream), weight, y [M, D], the widths, eps and the dtypes
  const void* delta;     // [M, D] in x's dtype, rows at delta_stride elements
  int64_t delta_stride;
  void* sum;  // [M, D] contiguous, x's dtype
};

cudaError_t AddRmsNorm(const AddRmsNormArgs& args, cudaStream_t stream);

}  // namespace ddtree::cuda
