// An absorbed-MLA layer's latent cache write in one launch (contract: kernels/ops.py): for each row i of the block,
// ckv[rows[i]] = the RMSNorm of kv[i, :R] (rms_norm_rows) and kpe[rows[i]] = the RoPE of kv[i, R:] (head_norm_rope
// without a weight), the same bits as those two ops: the three kernels run the same per-row code (row_norm.cuh).
//
// A block of 256 threads per row, as rms_norm_rows: its last warp (idle in the norm's loops up to 224 16-byte vectors
// a row: R = 512 is 64 of bfloat16) first turns the row's P rope dims straight into kpe, then the whole block norms
// the R latent dims into ckv, reduced in rms_norm_rows' order for that R. rows is read on the device, so a captured
// graph serves every prefix_len. Where the CPU op raises (a cache row outside [0, S)), this one cannot without a host
// sync: it skips that row, writing neither ckv nor kpe there.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ddtree::cuda {

struct LatentWriteArgs {
  const void* kv;        // [N, R + P], rows at kv_stride elements, kv's dtype
  int64_t kv_stride;
  const void* weight;    // [R], kv's dtype or float32
  const float* cos;      // [N, P/2]
  const float* sin;      // [N, P/2]
  const int64_t* rows;   // [N] at rows_stride: each row's cache row
  int64_t rows_stride;
  void* ckv;             // [S, R] contiguous, kv's dtype
  void* kpe;             // [S, P] contiguous, kv's dtype
  int64_t cache_rows;    // S
  int num_rows;          // N
  int lat_dim;           // R
  int rope_dim;          // P: even, at most kHeadNormRopeMaxDim
  float eps;
  bool bf16;             // kv (and the cache) bfloat16, else float32
  bool weight_f32;       // weight float32, else kv's dtype
  bool interleave;       // the rope pairs are (2j, 2j + 1), else (j, j + P/2)
};

cudaError_t LatentWrite(const LatentWriteArgs& args, cudaStream_t stream);

}  // namespace ddtree::cuda
