// A row-invariant matmul on CUDA (contract: kernels/ops.py): out [M, G, N] = x [M, G, K] W_g^T per group g, or,
// with group_ends, every row m of x [M, 1, K] through the one W_g whose range ends[g - 1] <= m < ends[g] holds it
// (the routed experts over their rows). A row's bits depend on that row, W and the plan alone, never on M or the
// other rows: the batch-invariant mode's matmul, where cuBLAS picks its kernel and split by M.
//
// bfloat16: mma.sync m16n8k16 tiles of 16 rows, the K range of a split walked in order, 16 columns at a time, in
// fp32; a split of K is cut at fixed positions (LinearRowsPlan: a function of the weight's shape and the GPU, not
// of M) and the splits' fp32 sums are added in split order, rounded to bfloat16 once. A tensor-core MMA computes
// each output row from that row's operands alone (tests/test_linear_rows.py checks it on the GPU). float32: every
// output is a warp's 32 strided float32 chains over k in order, folded by a fixed butterfly.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ddtree::cuda {

// The bfloat16 kernel: auto is wgmma on sm_90a, mma.sync elsewhere (DDTREE_LINEAR_ROWS_KERNEL picks one to compare;
// a row's bits are the same in every call of one kernel, not across the two).
enum class LinearRowsKernel { kAuto, kWgmma, kMmaSync };

struct LinearRowsPlan {
  int num_splits;   // K ranges per output, summed in order
  int split_depth;  // elements of K per split (the last may hold fewer); a multiple of the kernel's K chunk
};

struct LinearRowsArgs {
  const void* x;               // [M, G, K]: rows at row_stride, groups at group_stride (0 with group_ends)
  const void* weight;          // [G, N, K] contiguous (bfloat16: K a multiple of 8, zero-padded by the packing)
  const int32_t* group_ends;   // [G] on the device, or null (then every group takes every row)
  void* out;                   // [M, out_groups, N], x's dtype
  float* partial;              // [num_splits, M, out_groups, N] when the plan has more than one split
  int64_t row_stride;          // elements
  int64_t group_stride;        // elements
  int num_rows;                // M
  int num_groups;              // G
  int out_groups;              // 1 with group_ends, else G
  int depth;                   // K (bfloat16: a multiple of 8)
  int num_cols;                // N
  bool bf16;                   // else float32
  LinearRowsKernel kernel;
  LinearRowsPlan plan;
};

// The split of K for a weight of this shape on a GPU of num_sms multiprocessors (bfloat16; float32 and grouped calls
// never split: a grouped call's rows spread over many groups' tiles, which fill the grid, and without splits it
// writes no fp32 partial sums, 85 MB a projection at Kimi-K2's 257 tokens; bench_moe's moe layer).
LinearRowsPlan LinearRowsPlanFor(int num_cols, int depth, int num_groups, bool grouped, bool bf16, int num_sms);

// Whether the wgmma kernel runs here (an sm_90a build on a compute capability 9.0 GPU).
bool LinearRowsWgmmaAvailable();

// The fp32 workspace the launch needs (0 without splits).
size_t LinearRowsPartialElements(const LinearRowsArgs& args);

cudaError_t LinearRows(const LinearRowsArgs& args, cudaStream_t stream);

}  // namespace ddtree::cuda
