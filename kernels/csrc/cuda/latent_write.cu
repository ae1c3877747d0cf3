// The latent cache write's kernel (latent_write.cuh has the contract and the layout; row_norm.cuh the per-row math it
// shares with rms_norm_rows and head_norm_rope).
#include <cuda_bf16.h>

#include "common.cuh"
#include "head_norm_rope.cuh"
#include "latent_write.cuh"
#include "row_norm.cuh"

namespace ddtree::cuda {
namespace {

constexpr int kRopeWarp = kRowNormThreads / kWarpSize - 1;

template <typename T, typename W>
__global__ void __launch_bounds__(kRowNormThreads) latent_write_kernel(const LatentWriteArgs a) {
  __shared__ RowNormShared shared;
  const int i = blockIdx.x;
  const int64_t row = a.rows[static_cast<int64_t>(i) * a.rows_stride];
  if (row < 0 || row >= a.cache_rows) return;  // the whole block: no barrier is reached
  const T* kv = static_cast<const T*>(a.kv) + static_cast<int64_t>(i) * a.kv_stride;
  if (threadIdx.x / kWarpSize == kRopeWarp) {  // head_norm_rope's RoPE alone (no weight: T's, as its binding passes)
    const int64_t half = a.rope_dim / 2;
    T* kpe = static_cast<T*>(a.kpe) + row * a.rope_dim;
    norm_rope_head<T, T>(kv + a.lat_dim, nullptr, a.cos + i * half, a.sin + i * half, kpe, a.rope_dim, 0.0f,
                         a.interleave, threadIdx.x % kWarpSize);
  }
  T* ckv = static_cast<T*>(a.ckv) + row * a.lat_dim;
  rms_norm_row<T, W>(kv, static_cast<const W*>(a.weight), ckv, a.lat_dim, a.eps, shared);
}

}  // namespace

cudaError_t LatentWrite(const LatentWriteArgs& a, cudaStream_t stream) {
  if (a.rope_dim < 2 || a.rope_dim % 2 != 0 || a.rope_dim > kHeadNormRopeMaxDim || a.lat_dim < 1) {
    return cudaErrorInvalidValue;
  }
  if (a.num_rows == 0) return cudaSuccess;
  if (!a.bf16) {
    latent_write_kernel<float, float><<<a.num_rows, kRowNormThreads, 0, stream>>>(a);
  } else if (a.weight_f32) {
    latent_write_kernel<__nv_bfloat16, float><<<a.num_rows, kRowNormThreads, 0, stream>>>(a);
  } else {
    latent_write_kernel<__nv_bfloat16, __nv_bfloat16><<<a.num_rows, kRowNormThreads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

}  // namespace ddtree::cuda
