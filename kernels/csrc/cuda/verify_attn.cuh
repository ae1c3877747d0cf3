// Absorbed-MLA attention of a block of nodes over the latent cache (contract: kernels/ops.py), split-KV.
//
// Grid (split, head tile, node). A block holds one node and 8 of its heads (2 per warp); it streams its
// split's share of the rows prefix_len + N anyone may see through shared memory in tiles of 32 rows
// (fp32 in shared memory whatever the input dtype), the block rows filtered by the node's block_mask row,
// and keeps an online softmax per head. The split boundaries come from prefix_len, read on the device,
// so the grid is sized by the static capacity S and a split past the visible rows exits at once. With
// one split the block writes o_lat and lse; with more, each writes its unnormalised partial output, max
// and sum to the workspace and a second kernel combines them.
//
// The KV tile is shared by every head of the node, so the same loop shape takes tensor-core MMAs for the
// bfloat16 path (scores = Q_tile [heads, R+P] x K_tile^T, O += P x V_tile) without changing the split,
// workspace or combine layout.
//
// Where the CPU op raises on prefix_len < 0 or prefix_len + N > S, this one cannot without a host sync:
// it clamps prefix_len into [0, S - N], so it never reads outside the cache.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ddtree::cuda {

constexpr int kVerifyAttnMaxLatDim = 512;   // R (kv_lora_rank)
constexpr int kVerifyAttnMaxRopeDim = 64;   // P (qk_rope_head_dim)
constexpr int kVerifyAttnMaxNodes = 65535;  // N: one grid row per node
constexpr int kVerifyAttnMaxSplits = 256;   // splits of the rows per query tile (the combine step's limit)

// The kernels behind VerifyAttn. kAuto picks the fastest one that handles the arguments: wgmma (sm_90a
// build on a compute capability 9.0 GPU), else mma.sync (compute capability 8.0+), both bfloat16 with
// R = 512 and P = 64 and 16-byte aligned inputs; the CUDA-core kernel takes everything.
enum class VerifyAttnKernel { kAuto, kWgmma, kMmaSync, kCudaCore };

template <typename T>  // float or __nv_bfloat16
struct VerifyAttnArgs {
  const T* q_lat;             // [N, H, R]
  const T* q_pe;              // [N, H, P]
  const T* ckv;               // [S, R]
  const T* kpe;               // [S, P]
  const int64_t* prefix_len;  // 0-dim, on the device
  const bool* block_mask;     // [N, N]
  int num_nodes;              // N
  int num_heads;              // H
  int lat_dim;                // R
  int rope_dim;               // P
  int cache_rows;             // S
  float scale;
  VerifyAttnKernel kernel;    // VerifyAttnResolveKernel(...): never kAuto
  int num_sms;                // multiprocessors of the device (sizes the combine step)
  int num_splits;             // VerifyAttnNumSplits(...)
  float* workspace;           // VerifyAttnWorkspaceBytes(...) bytes, 16-byte aligned; unused with one split
  T* o_lat;                   // [N, H, R]
  float* lse;                 // [N, H]
};

// `wanted` when that kernel handles the arguments (kAuto: the fastest that does), else kAuto.
template <typename T>
VerifyAttnKernel VerifyAttnResolveKernel(const VerifyAttnArgs<T>& args, VerifyAttnKernel wanted);

// Splits of the visible rows per query tile for `kernel`: the CUDA-core kernel wants two waves of blocks,
// the tensor-core kernels their modelled best (verify_attn_split.cuh); one when the nodes alone fill the GPU.
// wanted (1 .. kVerifyAttnMaxSplits; 0 for the kernel's choice) forces a count, for benchmarks and tests.
int VerifyAttnNumSplits(VerifyAttnKernel kernel, int num_nodes, int num_heads, int cache_rows, int num_sms,
                        int wanted);

size_t VerifyAttnWorkspaceBytes(int num_nodes, int num_heads, int lat_dim, int num_splits);

template <typename T>
cudaError_t VerifyAttn(const VerifyAttnArgs<T>& args, cudaStream_t stream);

extern template VerifyAttnKernel VerifyAttnResolveKernel<float>(const VerifyAttnArgs<float>&, VerifyAttnKernel);
extern template VerifyAttnKernel VerifyAttnResolveKernel<__nv_bfloat16>(const VerifyAttnArgs<__nv_bfloat16>&,
                                                                        VerifyAttnKernel);
extern template cudaError_t VerifyAttn<float>(const VerifyAttnArgs<float>&, cudaStream_t);
extern template cudaError_t VerifyAttn<__nv_bfloat16>(const VerifyAttnArgs<__nv_bfloat16>&, cudaStream_t);

}  // namespace ddtree::cuda
