// The budget policy's choice among a step's budget buckets, on the GPU (contract: kernels/ops.py).
//
// One block, one launch: every thread takes nodes, reads its cell's log(realised / predicted) into shared memory,
// then sums it with its ancestors' (a walk up the parents, at most the tree's depth) and caps exp(score + sum) at 1;
// a block-wide prefix sum over the pop order gives the expected accepted length at every budget; each bucket's
// value is written, and thread 0 picks the largest (the first on ties, never NaN). Outputs stay on the device.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "budget_tree.cuh"

namespace ddtree::cuda {

struct BudgetChooseArgs {
  BudgetTree tree;
  const float* realised;   // [L + 1, C]
  const float* predicted;  // [L + 1, C]
  const int64_t* buckets;  // [K]
  const float* seconds;    // [K]
  int num_buckets;         // K
  int64_t* chosen;         // 0-dim
  float* expected;         // [K]
  float* value;            // [K]
};

cudaError_t BudgetChoose(const BudgetChooseArgs& args, cudaStream_t stream);

}  // namespace ddtree::cuda
