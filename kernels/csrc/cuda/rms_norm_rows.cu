// The row-invariant RMSNorm's kernel (rms_norm_rows.cuh has the contract and the reduction order; row_norm.cuh the
// row's math, which latent_write shares).
#include <cuda_bf16.h>

#include "common.cuh"
#include "rms_norm_rows.cuh"
#include "row_norm.cuh"

namespace ddtree::cuda {
namespace {

template <typename T, typename W>
__global__ void __launch_bounds__(kRowNormThreads) rms_norm_rows_kernel(const RmsNormRowsArgs a) {
  __shared__ RowNormShared shared;
  const int m = blockIdx.x;
  const T* row = static_cast<const T*>(a.x) + static_cast<int64_t>(m) * a.row_stride;
  T* y = static_cast<T*>(a.y) + static_cast<int64_t>(m) * a.width;
  rms_norm_row<T, W>(row, static_cast<const W*>(a.weight), y, a.width, a.eps, shared);
}

}  // namespace

cudaError_t RmsNormRows(const RmsNormRowsArgs& a, cudaStream_t stream) {
  if (a.num_rows == 0 || a.width == 0) return cudaSuccess;
  if (!a.bf16) {
    rms_norm_rows_kernel<float, float><<<a.num_rows, kRowNormThreads, 0, stream>>>(a);
  } else if (a.weight_f32) {
    rms_norm_rows_kernel<__nv_bfloat16, float><<<a.num_rows, kRowNormThreads, 0, stream>>>(a);
  } else {
    rms_norm_rows_kernel<__nv_bfloat16, __nv_bfloat16><<<a.num_rows, kRowNormThreads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

}  // namespace ddtree::cuda
