// The drafter's context cache write (context_write.cuh has the contract and the layout; row_norm.cuh a head's norm
// and RoPE, head_norm_rope's own).
#include <cuda_bf16.h>

#include "common.cuh"
#include "context_write.cuh"
#include "head_norm_rope.cuh"
#include "row_norm.cuh"

namespace ddtree::cuda {
namespace {

constexpr int kWarps = 8;

template <typename T, typename W>
__global__ void __launch_bounds__(kWarps * kWarpSize) context_write_kernel(const ContextWriteArgs a) {
  const int index = blockIdx.x * kWarps + threadIdx.x / kWarpSize;  // (row, head)
  if (index >= a.num_rows * a.num_groups) return;
  const int i = index / a.num_groups;
  const int g = index - i * a.num_groups;
  const int64_t position = *a.start + i;
  if (position < 0 || position >= a.cache_rows || position >= a.num_angles) return;  // the whole warp
  const int lane = threadIdx.x % kWarpSize;
  const int layer = g / a.num_kv_heads;
  const int64_t dst = ((layer * a.cache_rows + position) * a.num_kv_heads + (g - layer * a.num_kv_heads)) * a.head_dim;
  const T* row = static_cast<const T*>(a.kv) + i * a.kv_stride;
  const int64_t half = a.head_dim / 2;
  const float* cos = a.rope + position * half;
  norm_rope_head<T, W>(row + static_cast<int64_t>(g) * a.head_dim, static_cast<const W*>(a.k_norm) +
                       static_cast<int64_t>(g) * a.head_dim, cos, cos + a.num_angles * half,
                       static_cast<T*>(a.keys) + dst, a.head_dim, a.eps, false, lane);
  const T* value = row + static_cast<int64_t>(a.num_groups + g) * a.head_dim;
  T* out = static_cast<T*>(a.values) + dst;
  for (int d = lane; d < a.head_dim; d += kWarpSize) out[d] = value[d];
}

}  // namespace

cudaError_t ContextWrite(const ContextWriteArgs& a, cudaStream_t stream) {
  if (a.head_dim < 2 || a.head_dim % 2 != 0 || a.head_dim > kHeadNormRopeMaxDim) return cudaErrorInvalidValue;
  const int num_items = a.num_rows * a.num_groups;
  if (num_items == 0) return cudaSuccess;
  const int blocks = ceil_div(num_items, kWarps);
  if (!a.bf16) {
    context_write_kernel<float, float><<<blocks, kWarps * kWarpSize, 0, stream>>>(a);
  } else if (a.norm_f32) {
    context_write_kernel<__nv_bfloat16, float><<<blocks, kWarps * kWarpSize, 0, stream>>>(a);
  } else {
    context_write_kernel<__nv_bfloat16, __nv_bfloat16><<<blocks, kWarps * kWarpSize, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

}  // namespace ddtree::cuda
