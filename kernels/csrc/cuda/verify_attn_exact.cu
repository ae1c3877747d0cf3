// verify_attn's batch-invariant kernel (design: verify_attn_exact.cuh).
#include "common.cuh"
#include "verify_attn_exact.cuh"

namespace ddtree::cuda {
namespace {

constexpr int kThreads = 128;  // 4 warps
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 64;   // keys scored per round (the order of the softmax updates does not depend on it)
constexpr int kMaxDims = 512 + 64;
constexpr int kDimsPerThread = 512 / kThreads;

template <typename T>
__global__ void __launch_bounds__(kThreads) verify_attn_exact_kernel(VerifyAttnExactArgs<T> a) {
  __shared__ float q[kMaxDims];
  __shared__ float scores[kChunk];
  const int head = blockIdx.x, node = blockIdx.y, tid = threadIdx.x;
  const int lane = tid % 32, warp = tid / 32;
  const int dims = a.lat_dim + a.rope_dim;
  const size_t nh = static_cast<size_t>(node) * a.num_heads + head;
  for (int d = tid; d < dims; d += kThreads) {
    q[d] = d < a.lat_dim ? to_float(a.q_lat[nh * a.lat_dim + d]) : to_float(a.q_pe[nh * a.rope_dim + d - a.lat_dim]);
  }
  int64_t prefix = *a.prefix_len;
  prefix = prefix < 0 ? 0 : (prefix > a.cache_rows - a.num_nodes ? a.cache_rows - a.num_nodes : prefix);
  const bool* mask_row = a.block_mask + static_cast<size_t>(node) * a.num_nodes;
  const int64_t total = prefix + a.num_nodes;
  float acc[kDimsPerThread];
#pragma unroll
  for (int k = 0; k < kDimsPerThread; ++k) acc[k] = 0.0f;
  float m = neg_inf(), l = 0.0f;
  __syncthreads();
  for (int64_t base = 0; base < total; base += kChunk) {
    for (int j = warp; j < kChunk; j += kWarps) {  // one key's score per warp: lanes over dims, fixed tree
      const int64_t u = base + j;
      const bool visible = u < total && (u < prefix || mask_row[u - prefix]);
      float part = 0.0f;
      if (visible) {
        for (int d = lane; d < dims; d += 32) {
          part += q[d] * (d < a.lat_dim ? to_float(a.ckv[u * a.lat_dim + d])
                                        : to_float(a.kpe[u * a.rope_dim + d - a.lat_dim]));
        }
      }
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) part += __shfl_xor_sync(0xffffffffu, part, offset);
      if (lane == 0) scores[j] = visible ? a.scale * part : neg_inf();
    }
    __syncthreads();
    const int num = total - base < kChunk ? static_cast<int>(total - base) : kChunk;
    for (int j = 0; j < num; ++j) {  // every thread runs the same updates, in key order
      const float s = scores[j];
      if (s == neg_inf()) continue;
      const float m_new = fmaxf(m, s);
      const float alpha = expf(m - m_new), p = expf(s - m_new);
      l = l * alpha + p;
      m = m_new;
      const T* row = a.ckv + (base + j) * a.lat_dim;
#pragma unroll
      for (int k = 0; k < kDimsPerThread; ++k) {
        const int d = tid + k * kThreads;
        if (d < a.lat_dim) acc[k] = acc[k] * alpha + p * to_float(row[d]);
      }
    }
    __syncthreads();
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
  for (int k = 0; k < kDimsPerThread; ++k) {
    const int d = tid + k * kThreads;
    if (d < a.lat_dim) a.o_lat[nh * a.lat_dim + d] = from_float<T>(acc[k] * inv);
  }
  if (tid == 0) a.lse[nh] = l > 0.0f ? m + logf(l) : neg_inf();
}

}  // namespace

template <typename T>
cudaError_t VerifyAttnExact(const VerifyAttnExactArgs<T>& args, cudaStream_t stream) {
  if (args.num_nodes == 0 || args.num_heads == 0) return cudaSuccess;
  if (args.lat_dim > 512 || args.rope_dim > 64) return cudaErrorInvalidValue;
  verify_attn_exact_kernel<T><<<dim3(args.num_heads, args.num_nodes), kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

template cudaError_t VerifyAttnExact<float>(const VerifyAttnExactArgs<float>&, cudaStream_t);
template cudaError_t VerifyAttnExact<__nv_bfloat16>(const VerifyAttnExactArgs<__nv_bfloat16>&, cudaStream_t);

}  // namespace ddtree::cuda
