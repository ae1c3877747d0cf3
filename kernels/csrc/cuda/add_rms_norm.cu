// The residual add and RMSNorm's kernel (add_rms_norm.cuh has the contract): a block per row adds its columns in
// rms_norm_rows' column order, writes the sum, then norms that sum (row_norm.cuh): held in registers where the row
// fits, else the sum row it wrote, read back.
#include <cuda_bf16.h>

#include "add_rms_norm.cuh"
#include "common.cuh"
#include "row_norm.cuh"

namespace ddtree::cuda {
namespace {

// sum[d] = x[d] + delta[d] in float32, rounded to T, each thread over the columns rms_norm_row gives it.
template <typename T>
__device__ __forceinline__ void add_row(const T* x, const T* delta, T* sum, int width) {
  constexpr int kVec = Vec<T>::kSize;
  const bool aligned = (reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(delta) |
                        reinterpret_cast<uintptr_t>(sum)) % 16 == 0;
  if (width % kVec == 0 && aligned) {
#pragma unroll 4
    for (int c = threadIdx.x; c < width / kVec; c += kRowNormThreads) {
      const Vec<T> a = load_vec(x, c, true), b = load_vec(delta, c, true);
      Vec<T> out;
#pragma unroll
      for (int i = 0; i < kVec; ++i) out.v[i] = from_float<T>(to_float(a.v[i]) + to_float(b.v[i]));
      reinterpret_cast<Vec<T>*>(sum)[c] = out;
    }
  } else {
    for (int d = threadIdx.x; d < width; d += kRowNormThreads) {
      sum[d] = from_float<T>(to_float(x[d]) + to_float(delta[d]));
    }
  }
}

// A row that fits registers (HeldRow) keeps its sum there and norms it without reading it back.
template <typename T, typename W>
__device__ __forceinline__ void add_norm_held_row(const T* x, const T* delta, const W* weight, T* sum, T* y, int width,
                                                  float eps, RowNormShared& shared) {
  constexpr int kVec = Vec<T>::kSize;
  const bool aligned = (reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(delta) |
                        reinterpret_cast<uintptr_t>(sum)) % 16 == 0;
  HeldRow<T> held;
#pragma unroll
  for (int j = 0; j < kHeldVectors; ++j) {
    const int c = HeldRow<T>::column(j);
    if (c >= width / kVec) break;
    const Vec<T> a = load_vec(x, c, aligned), b = load_vec(delta, c, aligned);
#pragma unroll
    for (int i = 0; i < kVec; ++i) held.chunk[j].v[i] = from_float<T>(to_float(a.v[i]) + to_float(b.v[i]));
    if (aligned) {
      reinterpret_cast<Vec<T>*>(sum)[c] = held.chunk[j];
    } else {
#pragma unroll
      for (int i = 0; i < kVec; ++i) sum[c * kVec + i] = held.chunk[j].v[i];
    }
  }
  norm_held_row<T, W>(held, weight, y, width, eps, shared);
}

template <typename T, typename W>
__global__ void __launch_bounds__(kRowNormThreads) add_rms_norm_kernel(const AddRmsNormArgs a) {
  __shared__ RowNormShared shared;
  const RmsNormRowsArgs& n = a.norm;
  const int64_t m = blockIdx.x;
  const T* x = static_cast<const T*>(n.x) + m * n.row_stride;
  const T* delta = static_cast<const T*>(a.delta) + m * a.delta_stride;
  T* sum = static_cast<T*>(a.sum) + m * n.width;
  T* y = static_cast<T*>(n.y) + m * n.width;
  const W* weight = static_cast<const W*>(n.weight);
  if (HeldRow<T>::fits(n.width)) {
    add_norm_held_row<T, W>(x, delta, weight, sum, y, n.width, n.eps, shared);
    return;
  }
  add_row<T>(x, delta, sum, n.width);
  __syncthreads();  // the sum row, written by the whole block, is what the norm reads
  rms_norm_row<T, W>(sum, weight, y, n.width, n.eps, shared);
}

}  // namespace

cudaError_t AddRmsNorm(const AddRmsNormArgs& a, cudaStream_t stream) {
  const RmsNormRowsArgs& n = a.norm;
  if (n.num_rows == 0 || n.width == 0) return cudaSuccess;
  if (!n.bf16) {
    add_rms_norm_kernel<float, float><<<n.num_rows, kRowNormThreads, 0, stream>>>(a);
  } else if (n.weight_f32) {
    add_rms_norm_kernel<__nv_bfloat16, float><<<n.num_rows, kRowNormThreads, 0, stream>>>(a);
  } else {
    add_rms_norm_kernel<__nv_bfloat16, __nv_bfloat16><<<n.num_rows, kRowNormThreads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

}  // namespace ddtree::cuda
