// head_norm_rope's kernel (head_norm_rope.cuh has the contract and the layout; row_norm.cuh a head's math, which
// latent_write shares).
#include <cuda_bf16.h>

#include "common.cuh"
#include "head_norm_rope.cuh"
#include "row_norm.cuh"

namespace ddtree::cuda {
namespace {

constexpr int kWarps = 8;

template <typename T, typename W>
__global__ void __launch_bounds__(kWarps * kWarpSize) head_norm_rope_kernel(const HeadNormRopeArgs a) {
  const int index = blockIdx.x * kWarps + threadIdx.x / kWarpSize;  // (row, head)
  if (index >= a.num_rows * a.num_heads) return;
  const int m = index / a.num_heads;
  const int h = index - m * a.num_heads;
  const int half = a.head_dim / 2;
  const T* x = static_cast<const T*>(a.x) + m * a.row_stride + h * a.head_stride;
  const W* weight = static_cast<const W*>(a.weight);  // nullptr: the RoPE alone
  if (weight != nullptr) weight += static_cast<int64_t>(h) * a.head_dim;
  T* y = static_cast<T*>(a.y) + static_cast<int64_t>(index) * a.head_dim;
  norm_rope_head<T, W>(x, weight, a.cos + static_cast<int64_t>(m) * half, a.sin + static_cast<int64_t>(m) * half, y,
                       a.head_dim, a.eps, a.interleave, threadIdx.x % kWarpSize);
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
