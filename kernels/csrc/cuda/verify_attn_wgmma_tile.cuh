// What the sm_90a verify_attn kernels share (the fast one, verify_attn_wgmma.cu, and the batch-invariant one,
// verify_attn_exact_wgmma.cu): the tile shapes, the shared-memory budget and the swizzled tile loader.
// Shared memory holds every operand in the 128-byte-swizzled layout the wgmma descriptors read (wgmma.cuh):
// a [64, 576] tile is 9 atoms of 64 columns, atom a at 8192 a bytes, row r of an atom at 128 r, its 16-byte
// chunk c at chunk c ^ (r % 8).
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

#include "verify_attn_mma.cuh"

namespace ddtree::cuda::tc_sm90 {

using bf16 = __nv_bfloat16;
constexpr int kLat = 512;
constexpr int kRope = 64;
constexpr int kDim = kLat + kRope;
constexpr int kRows = 64;                    // query rows per block = cache rows per tile
constexpr int kThreads = 256;                // two warpgroups
constexpr int kGroupThreads = 128;
constexpr int kHalfCols = kLat / 2;          // value columns per warpgroup
constexpr uint32_t kAtomBytes = kRows * 128; // 64 rows x 64 bf16
constexpr uint32_t kTileBytes = (kDim / 64) * kAtomBytes;
constexpr uint32_t kPBytes = kAtomBytes;     // P: 64 x 64 bf16, one atom
constexpr uint32_t kKStepBytes = 32;         // 16 bf16 of K along a K-major row
constexpr uint32_t kVStepBytes = 16 * 128;   // 16 cache rows of an N-major atom
constexpr uint32_t kGroupBytes = 8 * 128;    // 8 rows of an atom: the stride byte offset of every operand
constexpr int kPReady = 1;                   // named barrier: P and alpha written by warpgroup 0
constexpr size_t kSmemBytes = 1024                       // alignment of the atoms
                              + 3 * size_t{kTileBytes}   // Q, 2 cache tiles
                              + kPBytes + 3 * kRows * sizeof(float);  // P, alpha, final row sum and max
static_assert(kSmemBytes <= 227 * 1024, "over the sm_90 shared memory per block");

// Rows row_of(u) for u in [row0, row0 + 64) of the [rows, R] and [rows, P] matrices into a swizzled tile at
// shared address `dst`, by kLoaders threads (t = 0 .. kLoaders - 1); u at or past `end` become zeros (finite
// for P V). row_of maps a tile row to its matrix row: the identity, or a node's logical row to its cache row.
// Thread t copies 16-byte chunks t % 8 + 8 k (k < 9: one per atom) of rows t / 8 + (kLoaders / 8) i: a warp
// instruction reads 4 rows x 128 contiguous bytes, and as every row of the thread is the same modulo 8,
// every address is the thread's base plus a constant (no per-chunk arithmetic: it used to cost more ALU
// time than the tile's MMAs).
template <int kLoaders, class RowOf>
__device__ __forceinline__ void load_tile(uint32_t dst, const bf16* lat, const bf16* rope, int row0, int end, int t,
                                          RowOf row_of) {
  constexpr int kRowStep = kLoaders / 8;
  static_assert(kRowStep % 8 == 0 && kRows % kRowStep == 0, "rows of a thread must agree modulo 8");
  const int lane8 = t % 8;
  const int first = t / 8;
  const uint32_t base = dst + first * 128 + ((lane8 ^ (first % 8)) << 4);
#pragma unroll
  for (int i = 0; i < kRows / kRowStep; ++i) {
    const int r = first + kRowStep * i;
    const bool ok = row0 + r < end;
    const size_t row = ok ? static_cast<size_t>(row_of(row0 + r)) : 0;
    const bf16* src = lat + row * kLat + lane8 * 8;
    const uint32_t d = base + kRowStep * i * 128;
#pragma unroll
    for (int k = 0; k < kLat / 64; ++k) cp_async_16(d + k * kAtomBytes, src + 64 * k, ok);
    cp_async_16(d + (kLat / 64) * kAtomBytes, rope + row * kRope + lane8 * 8, ok);
  }
}

template <int N>
__device__ __forceinline__ void scale_rows(float (&o)[N], float alpha_lo, float alpha_hi) {
#pragma unroll
  for (int j = 0; j < N / 4; ++j) {
    o[4 * j] *= alpha_lo;
    o[4 * j + 1] *= alpha_lo;
    o[4 * j + 2] *= alpha_hi;
    o[4 * j + 3] *= alpha_hi;
  }
}


template <int kLoaders>
__device__ __forceinline__ void load_tile(uint32_t dst, const bf16* lat, const bf16* rope, int row0, int end, int t) {
  load_tile<kLoaders>(dst, lat, rope, row0, end, t, [](int u) { return u; });
}

}  // namespace ddtree::cuda::tc_sm90
