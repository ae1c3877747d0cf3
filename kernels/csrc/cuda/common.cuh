// Device helpers shared by the ddtree CUDA kernels: launch checks, dtype conversion, order-preserving keys,
// warp reductions. Included by the .cu files only (the binding includes the per-op headers).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

// Returns the error of a CUDA runtime call (or of the launch just made) from the enclosing launcher.
#define DDTREE_CUDA_TRY(expr)                           \
  do {                                                  \
    const cudaError_t ddtree_err_ = (expr);             \
    if (ddtree_err_ != cudaSuccess) return ddtree_err_; \
  } while (0)

namespace ddtree::cuda {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kDefaultSmemBytes = 48 * 1024;  // above this a kernel needs cudaFuncSetAttribute

__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }
__host__ __device__ constexpr int round_up(int a, int b) { return ceil_div(a, b) * b; }

// Raises a kernel's dynamic shared memory limit when it needs more than the default 48 KB.
template <typename Kernel>
cudaError_t allow_dynamic_smem(Kernel kernel, size_t bytes) {
  if (bytes <= static_cast<size_t>(kDefaultSmemBytes)) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
}

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// Two floats as a bf16x2 word, `lo` in the low half (round to nearest even).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
         (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
}

// Order-preserving map float -> uint32: a < b (as floats) iff key(a) < key(b). -0.0 maps like +0.0 (they
// compare equal as floats) and NaN like -inf, so equal floats get equal keys. key(-inf) = 0x007fffff > 0,
// which leaves 0 free as an "empty" sentinel below every value. Three instructions: x + 0 turns -0.0 into
// +0.0, the max with -inf turns NaN into -inf (fmaxf returns the other operand), then the sign flip.
__device__ __forceinline__ uint32_t float_key(float x) {
  const uint32_t bits = __float_as_uint(fmaxf(__fadd_rn(x, 0.0f), -__int_as_float(0x7f800000)));
  return bits ^ (static_cast<uint32_t>(static_cast<int32_t>(bits) >> 31) | 0x80000000u);
}

__device__ __forceinline__ float key_float(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// Warp-wide max/min of a uint32 (a single REDUX instruction from sm_80 on).
__device__ __forceinline__ uint32_t warp_max_u32(uint32_t v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return __reduce_max_sync(kFullMask, v);
#else
  for (int offset = 16; offset > 0; offset >>= 1) v = max(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
#endif
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

// Writes zeros over n bytes with 16-byte stores where the alignment allows, split over `num_threads`.
__device__ __forceinline__ void fill_zero(uint8_t* dst, size_t n, int thread, int num_threads) {
  const size_t head = min(n, static_cast<size_t>((16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15));
  const size_t num_vec = (n - head) / 16;
  for (size_t i = thread; i < head; i += num_threads) dst[i] = 0;
  uint4* vec = reinterpret_cast<uint4*>(dst + head);
  for (size_t i = thread; i < num_vec; i += num_threads) vec[i] = make_uint4(0, 0, 0, 0);
  for (size_t i = head + num_vec * 16 + thread; i < n; i += num_threads) dst[i] = 0;
}

}  // namespace ddtree::cuda
