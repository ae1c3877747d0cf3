// The routed experts' rows on CUDA (contract: kernels/ops.py): expert_rows groups a forward's N x k token-expert
// assignments by expert, expert_combine sums each token's k outputs back. Both replace a chain of small torch ops
// (a sort, a searchsorted, index maps, an un-permuting copy, a weighted sum) in a decode step, where every launch
// costs more than its bytes.
//
// ExpertRows: one block counts the assignments per expert in shared memory, scans the counts into each expert's
// first row and writes group_ends; its first warp then places the assignments in token-major order, 32 at a time
// (lanes of one expert share a __match_any_sync mask: their ranks within the group, and one cursor bump), so an
// expert's rows keep their token order whatever the launch. A second kernel copies x's rows into place, a block per
// assignment. Ids outside [0, E] count as E (no expert here): they sort past every expert.
// ExpertCombine: a thread per (token, 8 columns) adds the token's k rows in rank order in float32, skipping the rows
// at or past min(M, group_ends[E - 1]).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ddtree::cuda {

struct ExpertRowsArgs {
  const void* x;        // [N, H], rows at x_row_bytes
  int64_t x_row_bytes;  // x's row stride in bytes
  int row_bytes;        // H * element size
  const int64_t* idx;   // [N, k]
  int num_assignments;  // N k
  int top_k;            // k
  int num_experts;      // E (<= 8191)
  void* rows;           // [N k, H]
  int64_t* slots;       // [N k]
  int32_t* group_ends;  // [E]
};

cudaError_t ExpertRows(const ExpertRowsArgs& args, cudaStream_t stream);

struct ExpertCombineArgs {
  const void* out;            // [M, H], rows at out_row_stride elements
  int64_t out_row_stride;
  int num_out_rows;           // M
  int width;                  // H
  const int64_t* slots;       // [N, k]
  const float* weights;       // [N, k]
  const int32_t* group_ends;  // [E]
  int num_experts;
  int num_tokens;             // N
  int top_k;
  void* y;                    // [N, H], out's dtype
  bool bf16;                  // else float32
};

cudaError_t ExpertCombine(const ExpertCombineArgs& args, cudaStream_t stream);

}  // namespace ddtree::cuda
