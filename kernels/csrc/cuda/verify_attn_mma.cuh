// Warp-level tensor-core and async-copy primitives (sm_80+ PTX) for the bfloat16 verify_attn path.
// Included by the tensor-core kernels (verify_attn_tc.cu, verify_attn_wgmma.cu). Shared-memory operands are
// generic pointers into shared memory.
//
// Fragment layouts of mma.m16n8k16 (g = lane / 4, q = lane % 4), each 32-bit register two bf16, low half
// first: A (16 x 16, row-major) a0 (g, 2q..2q+1), a1 (g+8, 2q..), a2 (g, 2q+8..), a3 (g+8, 2q+8..);
// B (16 x 8, k x n) b0 (k 2q..2q+1, n g), b1 (k 2q+8.., n g); C/D (16 x 8, fp32) d0, d1 (g, 2q..2q+1),
// d2, d3 (g+8, 2q..2q+1).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common.cuh"

namespace ddtree::cuda {

// Host side: whether the current GPU runs the primitives below (sm_80+), and whether a pointer suits cp.async's
// 16-byte copies.
inline bool gpu_has_mma_sync() {
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return false;
  return major >= 8;  // mma.sync bf16, ldmatrix, cp.async
}

inline bool aligned_16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared (a shared-window address), asynchronously; zeros instead when !valid (src is
// then not read).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}

__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  cp_async_16(smem_addr(dst), src, valid);
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits for every cp.async this thread issued (a barrier then publishes them to the block).
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// Four 8x8 bf16 matrices; lane l gives the address of row l % 8 of matrix l / 8 (16 contiguous bytes).
// Lane t receives, of matrix i, row t / 4 elements 2(t % 4), 2(t % 4) + 1 in r[i].
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row)));
}

// As ldmatrix_x4, transposed: lane t receives, of matrix i, rows 2(t % 4), 2(t % 4) + 1 of column t / 4.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row)));
}

// d += A (16 x 16 bf16) x B (16 x 8 bf16), fp32 accumulators.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// A row of a C/D fragment lives in a quad of lanes (q = lane % 4): its max and sum over the quad.
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(kFullMask, v, 1));
  return fmaxf(v, __shfl_xor_sync(kFullMask, v, 2));
}

__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(kFullMask, v, 1);
  return v + __shfl_xor_sync(kFullMask, v, 2);
}

}  // namespace ddtree::cuda
