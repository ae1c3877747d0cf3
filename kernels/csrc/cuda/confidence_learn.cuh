// One verified tree's evidence added to the budget policy's confidence tables, on the GPU (contract: kernels/ops.py).
//
// One block, one launch: the path's nodes are marked in shared memory, then every thread takes nodes and, for a
// node under a path node, adds its conditional probability exp(score - parent's score) to its cell of `predicted`,
// and 1 to its cell of `realised` if it is on the path, with float atomics (so the order of the sums is not fixed).
// Path entries that are not node indices are skipped (the CPU op refuses them).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "budget_tree.cuh"

namespace ddtree::cuda {

struct ConfidenceLearnArgs {
  BudgetTree tree;
  float* realised;       // [L + 1, C], added to
  float* predicted;      // [L + 1, C], added to
  const int64_t* path;   // [M]: tree_accept's, -1 padded
  int path_size;         // M
};

cudaError_t ConfidenceLearn(const ConfidenceLearnArgs& args, cudaStream_t stream);

}  // namespace ddtree::cuda
