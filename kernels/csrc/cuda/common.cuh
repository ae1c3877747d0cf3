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

// Programmatic dependent launch (sm_90): a kernel launched with launch_dependent() may start while the kernel
// before it on the stream is still running; it must call wait_for_previous_grid() before it reads what that
// kernel writes (the wait returns once that kernel has finished and its writes are visible). A kernel calls
// let_dependents_launch() once the next one may start taking SMs. All three are no-ops before sm_90.
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void let_dependents_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

template <typename... Params, typename... Args>
cudaError_t launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                             Args... args) {
  int device = 0;
  int major = 0;
  DDTREE_CUDA_TRY(cudaGetDevice(&device));
  DDTREE_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = major >= 9 ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
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

__device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }

// Order-preserving map float -> uint32: a < b (as floats) iff key(a) < key(b). -0.0 maps like +0.0 (they
// compare equal as floats) and NaN like -inf, so equal floats get equal keys. key(-inf) = 0x007fffff > 0,
// which leaves 0 free as an "empty" sentinel below every value. Three instructions: x + 0 turns -0.0 into
// +0.0, the max with -inf turns NaN into -inf (fmaxf returns the other operand), then the sign flip.
__device__ __forceinline__ uint32_t float_key(float x) {
  const uint32_t bits = __float_as_uint(fmaxf(__fadd_rn(x, 0.0f), neg_inf()));
  return bits ^ (static_cast<uint32_t>(static_cast<int32_t>(bits) >> 31) | 0x80000000u);
}

__device__ __forceinline__ float key_float(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// Warp-wide max, min and sum of an integer: a single REDUX instruction from sm_80 on, shuffles before.
enum class WarpOp { kMax, kMin, kAdd };

template <WarpOp op, typename T>
__device__ __forceinline__ T warp_reduce(T v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (op == WarpOp::kMax) return __reduce_max_sync(kFullMask, v);
  if constexpr (op == WarpOp::kMin) return __reduce_min_sync(kFullMask, v);
  if constexpr (op == WarpOp::kAdd) return __reduce_add_sync(kFullMask, v);
#else
  for (int offset = 16; offset > 0; offset >>= 1) {
    const T other = __shfl_xor_sync(kFullMask, v, offset);
    v = op == WarpOp::kMax ? max(v, other) : (op == WarpOp::kMin ? min(v, other) : v + other);
  }
  return v;
#endif
}

__device__ __forceinline__ uint32_t warp_max_u32(uint32_t v) { return warp_reduce<WarpOp::kMax>(v); }
__device__ __forceinline__ uint32_t warp_min_u32(uint32_t v) { return warp_reduce<WarpOp::kMin>(v); }
__device__ __forceinline__ int warp_sum_i32(int v) { return warp_reduce<WarpOp::kAdd>(v); }

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
