// head_norm_rope's kernel (head_norm_rope.cuh has the contract and the layout).
#include <cuda_bf16.h>

#include "common.cuh"
#include "head_norm_rope.cuh"

namespace ddtree::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kMaxPairs = kHeadNormRopeMaxDim / 2 / kWarpSize;

template <typename T, typename W>
__global__ void __launch_bounds__(kWarps * kWarpSize) head_norm_rope_kernel(const HeadNormRopeArgs a) {
  const int index = blockIdx.x * kWarps + threadIdx.x / kWarpSize;  // (row, head)
  if (index >= a.num_rows * a.num_heads) return;
  const int lane = threadIdx.x % kWarpSize;
  const int m = index / a.num_heads;
  const int h = index - m * a.num_heads;
  const int half = a.head_dim / 2;
  const T* x = static_cast<const T*>(a.x) + m * a.row_stride + static_cast<int64_t>(h) * a.head_dim;
  float lo[kMaxPairs], hi[kMaxPairs];
  float squares = 0.0f;
#pragma unroll
  for (int p = 0; p < kMaxPairs; ++p) {
    const int j = lane + p * kWarpSize;
    lo[p] = j < half ? to_float(x[j]) : 0.0f;
    hi[p] = j < half ? to_float(x[j + half]) : 0.0f;
    squares = fmaf(lo[p], lo[p], fmaf(hi[p], hi[p], squares));
  }
  const float scale = rsqrtf(warp_sum(squares) / static_cast<float>(a.head_dim) + a.eps);
  const W* weight = static_cast<const W*>(a.weight) + static_cast<int64_t>(h) * a.head_dim;
  const float* cos = a.cos + static_cast<int64_t>(m) * half;
  const float* sin = a.sin + static_cast<int64_t>(m) * half;
  T* y = static_cast<T*>(a.y) + static_cast<int64_t>(index) * a.head_dim;
#pragma unroll
  for (int p = 0; p < kMaxPairs; ++p) {
    const int j = lane + p * kWarpSize;
    if (j >= half) break;
    const float u = lo[p] * scale * to_float(weight[j]);
    const float v = hi[p] * scale * to_float(weight[j + half]);
    y[j] = from_float<T>(u * cos[j] - v * sin[j]);
    y[j + half] = from_float<T>(v * cos[j] + u * sin[j]);
  }
}

}  // namespace

cudaError_t HeadNormRope(const HeadNormRopeArgs& a, cudaStream_t stream) {
  const int num_items = a.num_rows * a.num_heads;
  if (num_items == 0) return cudaSuccess;
  const int blocks = ceil_div(num_items, kWarps);
  if (!a.bf16) {
    head_norm_rope_kernel<float, float><<<blocks, kWarps * kWarpSize, 0, stream>>>(a);
  } else if (a.weight_f32) {
    head_norm_rope_kernel<__nv_bfloat16, float><<<blocks, kWarps * kWarpSize, 0, stream>>>(a);
  } else {
    head_norm_rope_kernel<__nv_bfloat16, __nv_bfloat16><<<blocks, kWarps * kWarpSize, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

}  // namespace ddtree::cuda
