// cache_attn on CUDA (contract: kernels/ops.py): grouped-query attention of a few query rows over the valid rows
// of a key/value cache, the DFlash drafter's attention. The keys are split into chunks over the blocks of the
// grid (flash-decoding), so that a block of 8 queries x 64 heads over a few thousand keys fills the GPU where one
// block per key/value head would leave it idle; a second kernel merges the chunks' partial results.
//
// Block (query tile, key/value head, split), 4 warps: the tile holds 64 of the head's N * G query rows (node n,
// group head g at row n * G + g), a warp 16 of them. The split's keys are the num_splits-th part of the valid
// rows, read from the device (so a captured graph serves every cache length), in tiles of 64 keys loaded by
// cp.async into swizzled shared memory while the tile before is used. bfloat16 mma.sync: S = Q K^T, an online
// softmax in log2 units in registers, O += P V with P taken straight from S's accumulators.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ddtree::cuda {

struct CacheAttnArgs {
  const void* q;        // [N, Hq, D] bfloat16, each node's heads contiguous, nodes q_row_stride elements apart
  int64_t q_row_stride;
  const void* keys;     // [S, Hkv, D] bfloat16, contiguous
  const void* values;   // [S, Hkv, D] bfloat16, contiguous
  const int64_t* num_visible;  // 0-dim: rows [0, num_visible) are valid (clamped into [0, S])
  void* out;            // [N, Hq, D] bfloat16
  float* partial_o;     // [num_splits, Hkv, N * G, D] workspace
  float* partial_ml;    // [num_splits, Hkv, N * G, 2] workspace: row max (log2 units), row sum
  int num_nodes;        // N
  int num_heads;        // Hq
  int num_kv_heads;     // Hkv
  int head_dim;         // D
  int cache_rows;       // S
  int num_splits;
  float scale;
};

// The head dims and alignment the tensor-core kernel takes (bfloat16, sm_80+); the binding runs the plain-torch
// path for the rest.
bool CacheAttnSupported(const CacheAttnArgs& args);

// Splits for a call: about two blocks per SM, each at least one 64-key tile of the S cache rows.
int CacheAttnSplits(int num_nodes, int num_heads, int num_kv_heads, int cache_rows, int num_sms);

cudaError_t CacheAttn(const CacheAttnArgs& args, cudaStream_t stream);

}  // namespace ddtree::cuda
