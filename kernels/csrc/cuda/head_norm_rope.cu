// head_norm_rope's kernel (head_norm_rope.cuh has the contract and the layout).
#include <cuda_bf16.h>

#include "common.cuh"
#include "head_norm_rope.cuh"

namespace ddtree::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kMaxPairs = kHeadNormRopeMaxDim / 2 / kWarpSize;

// Writes head `index` of y (row m): each pair (u, v) turned by row m's angle j, u to dim j and v to dim j + D/2.
template <typename T>
__device__ void rotate(const float (&lo)[kMaxPairs], const float (&hi)[kMaxPairs], const HeadNormRopeArgs& a, int m,
                       int index, int lane) {
  const int half = a.head_dim / 2;
  const float* cos = a.cos + static_cast<int64_t>(m) * half;
  const float* sin = a.sin + static_cast<int64_t>(m) * half;
  T* y = static_cast<T*>(a.y) + static_cast<int64_t>(index) * a.head_dim;
#pragma unroll
  for (int p = 0; p < kMaxPairs; ++p) {
    const int j = lane + p * kWarpSize;
    if (j >= half) break;
    y[j] = from_float<T>(lo[p] * cos[j] - hi[p] * sin[j]);
    y[j + half] = from_float<T>(hi[p] * cos[j] + lo[p] * sin[j]);
  }
}

template <typename T, typename W>
__global__ void __launch_bounds__(kWarps * kWarpSize) head_norm_rope_kernel(const HeadNormRopeArgs a) {
  const int index = blockIdx.x * kWarps + threadIdx.x / kWarpSize;  // (row, head)
  if (index >= a.num_rows * a.num_heads) return;
  const int lane = threadIdx.x % kWarpSize;
  const int m = index / a.num_heads;
  const int h = index - m * a.num_heads;
  const int half = a.head_dim / 2;
  const T* x = static_cast<const T*>(a.x) + m * a.row_stride + h * a.head_stride;
  const int pair_step = a.interleave ? 2 : 1, partner = a.interleave ? 1 : half;
  float lo[kMaxPairs], hi[kMaxPairs];
  float squares = 0.0f;
#pragma unroll
  for (int p = 0; p < kMaxPairs; ++p) {
    const int j = lane + p * kWarpSize;
    lo[p] = j < half ? to_float(x[j * pair_step]) : 0.0f;
    hi[p] = j < half ? to_float(x[j * pair_step + partner]) : 0.0f;
    squares = fmaf(lo[p], lo[p], fmaf(hi[p], hi[p], squares));
  }
  if (a.weight != nullptr) {  // else the RoPE alone
    const float scale = rsqrtf(warp_sum(squares) / static_cast<float>(a.head_dim) + a.eps);
    const W* weight = static_cast<const W*>(a.weight) + static_cast<int64_t>(h) * a.head_dim;
#pragma unroll
    for (int p = 0; p < kMaxPairs; ++p) {
      const int j = lane + p * kWarpSize;
      if (j >= half) break;
      lo[p] = lo[p] * scale * to_float(weight[j * pair_step]);
      hi[p] = hi[p] * scale * to_float(weight[j * pair_step + partner]);
    }
  }
  rotate<T>(lo, hi, a, m, index, lane);
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
