// The row-invariant RMSNorm's kernel (rms_norm_rows.cuh has the contract and the reduction order).
#include <cuda_bf16.h>

#include "common.cuh"
#include "rms_norm_rows.cuh"

namespace ddtree::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T, typename W>
__global__ void __launch_bounds__(kThreads) rms_norm_rows_kernel(const RmsNormRowsArgs a) {
  __shared__ float warp_sums[kThreads / kWarpSize];
  __shared__ float scale;
  const int m = blockIdx.x;
  const T* row = static_cast<const T*>(a.x) + static_cast<int64_t>(m) * a.row_stride;
  float squares = 0.0f;
  for (int d = threadIdx.x; d < a.width; d += kThreads) {
    const float v = to_float(row[d]);
    squares = fmaf(v, v, squares);
  }
  squares = warp_sum(squares);
  if (threadIdx.x % kWarpSize == 0) warp_sums[threadIdx.x / kWarpSize] = squares;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int w = 0; w < kThreads / kWarpSize; ++w) total += warp_sums[w];
    scale = rsqrtf(total / static_cast<float>(a.width) + a.eps);
  }
  __syncthreads();
  const W* weight = static_cast<const W*>(a.weight);
  T* y = static_cast<T*>(a.y) + static_cast<int64_t>(m) * a.width;
  for (int d = threadIdx.x; d < a.width; d += kThreads) {
    y[d] = from_float<T>(to_float(row[d]) * scale * to_float(weight[d]));
  }
}

}  // namespace

cudaError_t RmsNormRows(const RmsNormRowsArgs& a, cudaStream_t stream) {
  if (a.num_rows == 0 || a.width == 0) return cudaSuccess;
  if (!a.bf16) {
    rms_norm_rows_kernel<float, float><<<a.num_rows, kThreads, 0, stream>>>(a);
  } else if (a.weight_f32) {
    rms_norm_rows_kernel<__nv_bfloat16, float><<<a.num_rows, kThreads, 0, stream>>>(a);
  } else {
    rms_norm_rows_kernel<__nv_bfloat16, __nv_bfloat16><<<a.num_rows, kThreads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

}  // namespace ddtree::cuda
