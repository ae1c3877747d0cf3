// verify_attn's batch-invariant kernel (contract: kernels/ops.py, batch_invariant=True).
//
// A node's visible rows are, in order, the prefix rows 0 .. prefix_len - 1 and its block rows in index order;
// for a tree node those are its ancestors, at positions prefix_len, prefix_len + 1, ...: the sequence of keys
// AR sees at that node's position. One block per (head, node) reduces over that sequence alone, one key after
// another with an online softmax (each key's score is one dot product in a fixed order: lanes over the
// dimensions, then a fixed shuffle tree), so the result depends on the sequence only, not on N, on where the
// rows sit in the cache or on any split: a node's output is bit for bit AR's at the same position when its
// inputs are. It serves what the tensor-core kernel (verify_attn_exact_wgmma.cuh) does not: float32, other
// widths, GPUs before sm_90a. The choice between the two depends on the dtype, widths and device only, never
// on N, so AR and a tree call always meet in the same kernel.
//
// prefix_len is read on the device and clamped into [0, S - N], as in verify_attn.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ddtree::cuda {

template <typename T>  // float or __nv_bfloat16
struct VerifyAttnExactArgs {
  const T* q_lat;             // [N, H, R]
  const T* q_pe;              // [N, H, P]
  const T* ckv;               // [S, R]
  const T* kpe;               // [S, P]
  const int64_t* prefix_len;  // 0-dim, on the device
  const bool* block_mask;     // [N, N]
  int num_nodes, num_heads, lat_dim, rope_dim, cache_rows;  // N, H, R (<= 512), P (<= 64), S
  float scale;
  T* o_lat;    // [N, H, R]
  float* lse;  // [N, H]
  // The tensor-core kernel's (verify_attn_exact_wgmma.cuh): its partials, how it spreads the work, and how many
  // nodes one launch takes (the workspace holds chunk_nodes nodes' partials; launch() runs the chunks in turn).
  float* workspace;
  bool group_per_block;
  int chunk_nodes;
  int split_target;  // the most splits a row's positions are cut into (exact_sm90::split_rows_for)
};

template <typename T>
cudaError_t VerifyAttnExact(const VerifyAttnExactArgs<T>& args, cudaStream_t stream);

extern template cudaError_t VerifyAttnExact<float>(const VerifyAttnExactArgs<float>&, cudaStream_t);
extern template cudaError_t VerifyAttnExact<__nv_bfloat16>(const VerifyAttnExactArgs<__nv_bfloat16>&, cudaStream_t);

}  // namespace ddtree::cuda
