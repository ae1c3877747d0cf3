// The row-invariant RMSNorm's kernel (rms_norm_rows.cuh has the contract and the reduction order).
#include <cuda_bf16.h>

#include "common.cuh"
#include "rms_norm_rows.cuh"

namespace ddtree::cuda {
namespace {

constexpr int kThreads = 256;

// Where D is a multiple of a 16-byte vector, thread t adds the squares of vectors t, t + 256, ... in element order
// (its loads independent and in flight together: a row of 7168 bf16 is 3.5 loads a thread, not 28 serial ones),
// loading each vector whole when the row is 16-byte aligned and element by element when not, in the same order;
// else columns t, t + 256, ... So the order depends on D alone.
template <typename T>
struct alignas(16) Vec {
  static constexpr int kSize = 16 / sizeof(T);
  T v[kSize];
};

template <typename T>
__device__ __forceinline__ Vec<T> load_vec(const T* row, int c, bool aligned) {
  if (aligned) return reinterpret_cast<const Vec<T>*>(row)[c];
  Vec<T> out;
#pragma unroll
  for (int i = 0; i < Vec<T>::kSize; ++i) out.v[i] = row[c * Vec<T>::kSize + i];
  return out;
}

template <typename T, typename W>
__global__ void __launch_bounds__(kThreads) rms_norm_rows_kernel(const RmsNormRowsArgs a) {
  __shared__ float warp_sums[kThreads / kWarpSize];
  __shared__ float scale;
  constexpr int kVec = Vec<T>::kSize;
  const int m = blockIdx.x;
  const T* row = static_cast<const T*>(a.x) + static_cast<int64_t>(m) * a.row_stride;
  T* y = static_cast<T*>(a.y) + static_cast<int64_t>(m) * a.width;
  const bool chunked = a.width % kVec == 0;
  const bool aligned = reinterpret_cast<uintptr_t>(row) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0;
  float squares = 0.0f;
  if (chunked) {
#pragma unroll 4
    for (int c = threadIdx.x; c < a.width / kVec; c += kThreads) {
      const Vec<T> chunk = load_vec(row, c, aligned);
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const float v = to_float(chunk.v[i]);
        squares = fmaf(v, v, squares);
      }
    }
  } else {
    for (int d = threadIdx.x; d < a.width; d += kThreads) {
      const float v = to_float(row[d]);
      squares = fmaf(v, v, squares);
    }
  }
  squares = warp_sum(squares);
  if (threadIdx.x % kWarpSize == 0) warp_sums[threadIdx.x / kWarpSize] = squares;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int w = 0; w < kThreads / kWarpSize; ++w) total += warp_sums[w];
    scale = rsqrtf(total / static_cast<float>(a.width) + a.eps);
  }
  __syncthreads();
  const W* weight = static_cast<const W*>(a.weight);
  if (chunked) {
#pragma unroll 4
    for (int c = threadIdx.x; c < a.width / kVec; c += kThreads) {
      const Vec<T> chunk = load_vec(row, c, aligned);
      Vec<T> out;
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        out.v[i] = from_float<T>(to_float(chunk.v[i]) * scale * to_float(weight[c * kVec + i]));
      }
      if (aligned) {
        reinterpret_cast<Vec<T>*>(y)[c] = out;
      } else {
#pragma unroll
        for (int i = 0; i < kVec; ++i) y[c * kVec + i] = out.v[i];
      }
    }
  } else {
    for (int d = threadIdx.x; d < a.width; d += kThreads) {
      y[d] = from_float<T>(to_float(row[d]) * scale * to_float(weight[d]));
    }
  }
}

}  // namespace

cudaError_t RmsNormRows(const RmsNormRowsArgs& a, cudaStream_t stream) {
  if (a.num_rows == 0 || a.width == 0) return cudaSuccess;
  if (!a.bf16) {
    rms_norm_rows_kernel<float, float><<<a.num_rows, kThreads, 0, stream>>>(a);
  } else if (a.weight_f32) {
    rms_norm_rows_kernel<__nv_bfloat16, float><<<a.num_rows, kThreads, 0, stream>>>(a);
  } else {
    rms_norm_rows_kernel<__nv_bfloat16, __nv_bfloat16><<<a.num_rows, kThreads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

}  // namespace ddtree::cuda
