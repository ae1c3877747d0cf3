// SwiGLU's activation kernel (silu_mul.cuh has the contract): a thread per 16-byte vector of out where every row's
// halves are 16-byte aligned, else per element; block b covers one row's columns (b mod the blocks a row takes), so
// the grid has no row limit and no thread divides.
#include <cuda_bf16.h>

#include "common.cuh"
#include "row_norm.cuh"
#include "silu_mul.cuh"

namespace ddtree::cuda {
namespace {

constexpr int kSiluMulThreads = 256;

// silu(g) = g / (1 + e^-g) in float32 (torch's formula), rounded to T, times u, rounded to T.
template <typename T>
__device__ __forceinline__ T silu_times(T g, T u) {
  const float gate = to_float(g);
  const T silu = from_float<T>(gate / (1.0f + expf(-gate)));
  return from_float<T>(to_float(silu) * to_float(u));
}

template <typename T, bool kVectors>
__global__ void __launch_bounds__(kSiluMulThreads) silu_mul_kernel(const SiluMulArgs a) {
  const int row_blocks = ceil_div(kVectors ? a.width / Vec<T>::kSize : a.width, kSiluMulThreads);
  const int64_t m = blockIdx.x / row_blocks;
  const T* gate = static_cast<const T*>(a.gate_up) + m * a.row_stride;
  const T* up = gate + a.width;
  T* out = static_cast<T*>(a.out) + m * a.width;
  const int c = static_cast<int>(blockIdx.x % row_blocks) * kSiluMulThreads + threadIdx.x;
  if constexpr (kVectors) {
    if (c >= a.width / Vec<T>::kSize) return;
    const Vec<T> g = load_vec(gate, c, true), u = load_vec(up, c, true);
    Vec<T> y;
#pragma unroll
    for (int i = 0; i < Vec<T>::kSize; ++i) y.v[i] = silu_times(g.v[i], u.v[i]);
    reinterpret_cast<Vec<T>*>(out)[c] = y;
  } else {
    if (c < a.width) out[c] = silu_times(gate[c], up[c]);
  }
}

template <typename T>
cudaError_t launch(const SiluMulArgs& a, cudaStream_t stream) {
  constexpr int kVec = Vec<T>::kSize;
  const bool vectors = a.width % kVec == 0 && a.row_stride % kVec == 0 &&
                       (reinterpret_cast<uintptr_t>(a.gate_up) | reinterpret_cast<uintptr_t>(a.out)) % 16 == 0;
  const int columns = vectors ? a.width / kVec : a.width;
  const int64_t blocks = static_cast<int64_t>(ceil_div(columns, kSiluMulThreads)) * a.num_rows;
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(blocks));
  if (vectors) {
    silu_mul_kernel<T, true><<<grid, kSiluMulThreads, 0, stream>>>(a);
  } else {
    silu_mul_kernel<T, false><<<grid, kSiluMulThreads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t SiluMul(const SiluMulArgs& a, cudaStream_t stream) {
  if (a.num_rows == 0 || a.width == 0) return cudaSuccess;
  return a.bf16 ? launch<__nv_bfloat16>(a, stream) : launch<float>(a, stream);
}

}  // namespace ddtree::cuda
