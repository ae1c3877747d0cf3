// The router's kernel (router_logits.cuh has the contract): warp w of block (b, t) computes expert 4b + w's logits for
// the block's rows 16t .. 16t + 15, lane l summing its chunks of 4 columns (router_order.h) for every row from one load
// of the weight's chunk, eight chunks of it in flight a lane; then a butterfly per row. The weight, 4 x E x H bytes,
// is read from memory once whatever N (the row tiles after the first find it in L2).
#include <cuda_bf16.h>

#include <algorithm>

#include "../router_order.h"
#include "common.cuh"
#include "router_logits.cuh"

namespace ddtree::cuda {
namespace {

constexpr int kExpertsPerBlock = 4;  // a warp each
constexpr int kRowsPerBlock = 16;
constexpr int kChunksInFlight = 8;  // weight chunks a lane loads before it uses one
static_assert(kRouterLanes == kWarpSize, "a warp's lanes are the order's chains");

__device__ __forceinline__ float4 load_weight(const float* w, int c, bool aligned) {
  if (aligned) return __ldg(reinterpret_cast<const float4*>(w) + c);
  return make_float4(__ldg(w + 4 * c), __ldg(w + 4 * c + 1), __ldg(w + 4 * c + 2), __ldg(w + 4 * c + 3));
}

__device__ __forceinline__ float4 load_x(const float* x, int c, bool aligned) { return load_weight(x, c, aligned); }

__device__ __forceinline__ float4 load_x(const __nv_bfloat16* x, int c, bool aligned) {
  if (aligned) {
    const uint2 raw = *reinterpret_cast<const uint2*>(x + 4 * c);
    const __nv_bfloat162 lo = *reinterpret_cast<const __nv_bfloat162*>(&raw.x);
    const __nv_bfloat162 hi = *reinterpret_cast<const __nv_bfloat162*>(&raw.y);
    return make_float4(__low2float(lo), __high2float(lo), __low2float(hi), __high2float(hi));
  }
  return make_float4(to_float(x[4 * c]), to_float(x[4 * c + 1]), to_float(x[4 * c + 2]), to_float(x[4 * c + 3]));
}

__device__ __forceinline__ float fma4(float4 x, float4 w, float sum) {
  sum = fmaf(x.x, w.x, sum);
  sum = fmaf(x.y, w.y, sum);
  sum = fmaf(x.z, w.z, sum);
  return fmaf(x.w, w.w, sum);
}

template <typename T>
__global__ void __launch_bounds__(kExpertsPerBlock * kWarpSize)
    router_logits_kernel(const RouterLogitsArgs a, bool weight_aligned, bool x_aligned) {
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int expert = blockIdx.x * kExpertsPerBlock + warp;
  if (expert >= a.num_experts) return;
  const int first_row = blockIdx.y * kRowsPerBlock;
  const int rows = min(kRowsPerBlock, a.num_rows - first_row);
  const float* w = a.weight + static_cast<int64_t>(expert) * a.width;
  const T* x = static_cast<const T*>(a.x) + static_cast<int64_t>(first_row) * a.row_stride;
  float sums[kRowsPerBlock];
#pragma unroll
  for (int r = 0; r < kRowsPerBlock; ++r) sums[r] = 0.0f;
  if (a.width % kRouterChunk == 0) {
    const int chunks = a.width / kRouterChunk;
    for (int base = lane; base < chunks; base += kWarpSize * kChunksInFlight) {
      float4 wv[kChunksInFlight];
#pragma unroll
      for (int u = 0; u < kChunksInFlight; ++u) {
        const int c = base + u * kWarpSize;
        wv[u] = c < chunks ? load_weight(w, c, weight_aligned) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (int r = 0; r < kRowsPerBlock; ++r) {
        if (r >= rows) break;
        const T* row = x + r * a.row_stride;
#pragma unroll
        for (int u = 0; u < kChunksInFlight; ++u) {
          const int c = base + u * kWarpSize;
          if (c < chunks) sums[r] = fma4(load_x(row, c, x_aligned), wv[u], sums[r]);
        }
      }
    }
  } else {
    for (int h = lane; h < a.width; h += kWarpSize) {
      const float wh = __ldg(w + h);
#pragma unroll
      for (int r = 0; r < kRowsPerBlock; ++r) {
        if (r >= rows) break;
        sums[r] = fmaf(to_float(x[r * a.row_stride + h]), wh, sums[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerBlock; ++r) {
    if (r >= rows) break;
    float sum = sums[r];
    for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) sum += __shfl_xor_sync(kFullMask, sum, offset);
    if (lane == 0) a.out[static_cast<int64_t>(first_row + r) * a.num_experts + expert] = sum;
  }
}

}  // namespace

cudaError_t RouterLogits(const RouterLogitsArgs& a, cudaStream_t stream) {
  if (a.num_rows == 0) return cudaSuccess;
  const int x_bytes = a.bf16 ? 2 : 4;
  const int chunk_bytes = kRouterChunk * x_bytes;
  const bool weight_aligned = reinterpret_cast<uintptr_t>(a.weight) % 16 == 0;
  const bool x_aligned =
      reinterpret_cast<uintptr_t>(a.x) % chunk_bytes == 0 && (a.row_stride * x_bytes) % chunk_bytes == 0;
  const dim3 grid(ceil_div(a.num_experts, kExpertsPerBlock), ceil_div(a.num_rows, kRowsPerBlock));
  constexpr int kThreads = kExpertsPerBlock * kWarpSize;
  if (a.bf16) {
    router_logits_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(a, weight_aligned, x_aligned);
  } else {
    router_logits_kernel<float><<<grid, kThreads, 0, stream>>>(a, weight_aligned, x_aligned);
  }
  return cudaGetLastError();
}

}  // namespace ddtree::cuda
