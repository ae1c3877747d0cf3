// DeepSeek-V3 routing on CUDA (contract: kernels/ops.py moe_route): a warp per row, up to four rows a block.
//
// A warp holds its row's scores [E], choices [E], group scores [G] and picks [k] in dynamic shared memory; large E
// takes fewer warps a block. Every selection (a group's best two, the kept groups, the top-k) follows one total order,
// "larger first, NaN above every number, ties to the lower index", written as a 64-bit key per element: each lane
// keeps its best key not yet picked, a pick is one warp max, and only the lane that held it looks again (at keys in
// registers up to 512 elements a row). So the picks are the CPU kernel's. Scores use the exp both kernels share
// (../route_exp.h) and a softmax row's sum is added in one order on both (lane chains, then a butterfly), so a row
// routes to the CPU's bits. A row's bits depend on the row alone, never on N or the launch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ddtree::cuda {

struct MoeRouteArgs {
  const float* logits;  // [N, E]
  const float* bias;    // [E]
  int num_rows;         // N
  int num_experts;      // E (<= 8191)
  int top_k;            // k
  int num_groups;       // G, dividing E
  int top_groups;       // groups kept, in [1, G]
  bool softmax;         // else sigmoid
  bool normalize;
  float scaling;
  int64_t* idx;         // [N, k]
  float* weights;       // [N, k]
  int32_t* counts;      // [E], nullptr: nothing counted
  const bool* real;     // [N], nullptr: every row counted
};

cudaError_t MoeRoute(const MoeRouteArgs& args, cudaStream_t stream);

}  // namespace ddtree::cuda
