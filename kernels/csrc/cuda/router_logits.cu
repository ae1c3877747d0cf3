// The router's kernel (router_logits.cuh has the contract). Lane l of a warp is chain l of router_order.h for each of
// the warp's kExperts experts and the block's rows: it loads a chunk of 4 columns of each expert's weight, then for
// each row the row's chunk (converted to float once) and one fma4 per expert, kInFlight chunks of weight loaded
// before any is used; a butterfly per logit ends it. Any tile sums in the same order, so the bits are the same
// whatever N. The tile grows with N (RouterLogits; H100, Kimi-K2's 384 x 7,168, numbers in benchmarks/RESULTS.md):
// few rows want many small blocks, many rows a tile that shares each load of x among experts and each load of the
// weight among rows. A logit's 32 chains leave a lane a long serial sum at H = 7,168, so the kernel is latency-bound
// and slower than cuBLAS's float32 gemm; the fast mode routes through that gemm, the batch-invariant mode through this.
#include <cuda_bf16.h>

#include <algorithm>

#include "../router_order.h"
#include "common.cuh"
#include "router_logits.cuh"

namespace ddtree::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
static_assert(kRouterLanes == kWarpSize, "a warp's lanes are the order's chains");

__device__ __forceinline__ float4 load_weight(const float* w, int c, bool aligned) {
  if (aligned) return __ldg(reinterpret_cast<const float4*>(w) + c);
  return make_float4(__ldg(w + 4 * c), __ldg(w + 4 * c + 1), __ldg(w + 4 * c + 2), __ldg(w + 4 * c + 3));
}

__device__ __forceinline__ float4 load_x(const float* x, int c, bool aligned) { return load_weight(x, c, aligned); }

__device__ __forceinline__ float4 load_x(const __nv_bfloat16* x, int c, bool aligned) {
  if (aligned) {
    const uint2 raw = __ldg(reinterpret_cast<const uint2*>(x + 4 * c));
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

// Warp w of block (b, t): experts kExperts (kWarpsPerBlock b + w) onwards, rows rows_per_block t onwards.
template <typename T, int kExperts, int kRows, int kInFlight>
__global__ void __launch_bounds__(kWarpsPerBlock * kWarpSize)
    router_logits_kernel(const RouterLogitsArgs a, int rows_per_block, bool weight_aligned, bool x_aligned) {
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int first_expert = (blockIdx.x * kWarpsPerBlock + warp) * kExperts;
  if (first_expert >= a.num_experts) return;
  const int num_experts = min(kExperts, a.num_experts - first_expert);
  const int first_row = blockIdx.y * rows_per_block;
  const int rows = min(rows_per_block, a.num_rows - first_row);
  const float* w = a.weight + static_cast<int64_t>(first_expert) * a.width;
  const T* x = static_cast<const T*>(a.x) + static_cast<int64_t>(first_row) * a.row_stride;
  float sums[kExperts][kRows];
#pragma unroll
  for (int e = 0; e < kExperts; ++e) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) sums[e][r] = 0.0f;
  }
  if (a.width % kRouterChunk == 0) {
    const int chunks = a.width / kRouterChunk;
    for (int base = lane; base < chunks; base += kWarpSize * kInFlight) {
      float4 wv[kExperts][kInFlight];
#pragma unroll
      for (int e = 0; e < kExperts; ++e) {
#pragma unroll
        for (int u = 0; u < kInFlight; ++u) {
          const int c = base + u * kWarpSize;
          wv[e][u] = c < chunks && e < num_experts ? load_weight(w + static_cast<int64_t>(e) * a.width, c,
                                                                 weight_aligned)
                                                   : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r >= rows) break;
        const T* row = x + r * a.row_stride;
#pragma unroll
        for (int u = 0; u < kInFlight; ++u) {
          const int c = base + u * kWarpSize;
          if (c >= chunks) break;
          const float4 xv = load_x(row, c, x_aligned);
#pragma unroll
          for (int e = 0; e < kExperts; ++e) sums[e][r] = fma4(xv, wv[e][u], sums[e][r]);
        }
      }
    }
  } else {
    for (int h = lane; h < a.width; h += kWarpSize) {
      float wh[kExperts];
#pragma unroll
      for (int e = 0; e < kExperts; ++e) {
        wh[e] = e < num_experts ? __ldg(w + static_cast<int64_t>(e) * a.width + h) : 0.0f;
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r >= rows) break;
        const float xh = to_float(x[r * a.row_stride + h]);
#pragma unroll
        for (int e = 0; e < kExperts; ++e) sums[e][r] = fmaf(xh, wh[e], sums[e][r]);
      }
    }
  }
#pragma unroll
  for (int e = 0; e < kExperts; ++e) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (r >= rows) break;
      float sum = sums[e][r];
      for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) sum += __shfl_xor_sync(kFullMask, sum, offset);
      if (lane == 0 && e < num_experts) {
        a.out[static_cast<int64_t>(first_row + r) * a.num_experts + first_expert + e] = sum;
      }
    }
  }
}

template <int kExperts, int kRows, int kInFlight>
cudaError_t launch_router(const RouterLogitsArgs& a, cudaStream_t stream) {
  const int x_bytes = a.bf16 ? 2 : 4;
  const int chunk_bytes = kRouterChunk * x_bytes;
  const bool weight_aligned = reinterpret_cast<uintptr_t>(a.weight) % 16 == 0;
  const bool x_aligned =
      reinterpret_cast<uintptr_t>(a.x) % chunk_bytes == 0 && (a.row_stride * x_bytes) % chunk_bytes == 0;
  const int num_tiles = ceil_div(a.num_rows, kRows);
  const int rows_per_block = ceil_div(a.num_rows, num_tiles);  // the rows spread evenly over the tiles
  const dim3 grid(ceil_div(a.num_experts, kWarpsPerBlock * kExperts), num_tiles);
  constexpr int kThreads = kWarpsPerBlock * kWarpSize;
  if (a.bf16) {
    router_logits_kernel<__nv_bfloat16, kExperts, kRows, kInFlight>
        <<<grid, kThreads, 0, stream>>>(a, rows_per_block, weight_aligned, x_aligned);
  } else {
    router_logits_kernel<float, kExperts, kRows, kInFlight>
        <<<grid, kThreads, 0, stream>>>(a, rows_per_block, weight_aligned, x_aligned);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t RouterLogits(const RouterLogitsArgs& a, cudaStream_t stream) {
  if (a.num_rows == 0) return cudaSuccess;
  if (a.num_rows <= 32) return launch_router<1, 4, 8>(a, stream);
  if (a.num_rows <= 96) return launch_router<4, 4, 2>(a, stream);
  if (a.num_rows <= 192) return launch_router<4, 8, 2>(a, stream);
  return launch_router<8, 8, 1>(a, stream);
}

}  // namespace ddtree::cuda
