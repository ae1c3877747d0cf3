// The DFlash drafter's context cache write in one launch (contract: kernels/ops.py): for row i of kv and key/value head
// g (layer g / Hkv, head g % Hkv), keys[layer, start + i, head] = head_norm_rope of the key head by k_norm[g] at the
// angles of position start + i, values[layer, start + i, head] = the value head as it is. A warp per (row, head) runs
// head_norm_rope's per-head code (row_norm.cuh), so the bits are that op's; where head_norm_rope, the angles' gather,
// the positions' add and two index_copy_ took five launches. start is read on the device, so a captured graph serves
// every context length. Where the CPU op raises (a position outside [0, min(S, P))), this one cannot without a host
// sync: it skips that row.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ddtree::cuda {

struct ContextWriteArgs {
  const void* kv;         // [n, 2 G D], rows at kv_stride elements: G key heads of D, then G value heads
  int64_t kv_stride;
  const void* k_norm;     // [G, D], kv's dtype or float32
  const float* rope;      // [2, P, D/2]: cos, then sin
  int64_t num_angles;     // P
  const int64_t* start;   // 0-dim: row i goes to position *start + i
  void* keys;             // [layers, S, Hkv, D] contiguous, kv's dtype
  void* values;           // [layers, S, Hkv, D] contiguous, kv's dtype
  int64_t cache_rows;     // S
  int num_rows;           // n
  int num_groups;         // G = layers Hkv
  int num_kv_heads;       // Hkv
  int head_dim;           // D: even, at most kHeadNormRopeMaxDim
  float eps;
  bool bf16;              // kv (and the cache) bfloat16, else float32
  bool norm_f32;          // k_norm float32, else kv's dtype
};

cudaError_t ContextWrite(const ContextWriteArgs& args, cudaStream_t stream);

}  // namespace ddtree::cuda
