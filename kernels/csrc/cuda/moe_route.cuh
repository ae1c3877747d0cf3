// DeepSeek-V3 routing on CUDA (contract: kernels/ops.py moe_route): a warp per row, up to four rows a block.
//
// A warp holds its row's scores [E], choices [E] and group scores [G] in dynamic shared memory; large E takes fewer
// warps a block. Every selection (a group's best two, the kept groups, the top-k) is a repeated warp-wide argmax:
// each pick is the best element strictly after the previous pick in the total order "larger first, NaN above every
// number, ties to the lower index", so nothing is marked or removed and the picks are the CPU kernel's. Scores use the exp
// both kernels share (../route_exp.h) and a softmax row's sum is added in one order on both (lane chains, then a
// butterfly), so a row routes to the CPU's bits. A row's bits depend on the row alone, never on N or the launch.
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
