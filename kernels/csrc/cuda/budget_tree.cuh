// The tree and confidence tables the budget policy's CUDA kernels read (budget_choose.cuh, confidence_learn.cuh;
// contracts: kernels/ops.py). Pure CUDA: the binding includes it too.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ddtree::cuda {

constexpr int kBudgetMaxNodes = 1025;  // tree_build's largest tree (budget 1024 and the root); one block holds it

struct BudgetTree {
  const float* scores;     // [N]
  const int64_t* parents;  // [N]
  const int64_t* depths;   // [N]
  const int64_t* ranks;    // [N]
  int num_nodes;           // N
  int num_depths;          // L + 1: the confidence tables' rows
  int num_classes;         // C: their columns
};

// Row-major index of node i's cell in the [L + 1, C] tables: class min(rank, C - 1), a negative rank class 0.
// -1 where the node has none: depth 0 (its factor is 0 and it learns nothing) or a depth outside the tables,
// which the CPU op refuses and a kernel cannot.
__host__ __device__ inline int confidence_cell(const BudgetTree& tree, int i) {
  const int64_t depth = tree.depths[i];
  const int64_t rank = tree.ranks[i];
  if (depth < 1 || depth >= tree.num_depths) return -1;
  const int64_t cls = rank < 0 ? 0 : (rank < tree.num_classes - 1 ? rank : tree.num_classes - 1);
  return static_cast<int>(depth * tree.num_classes + cls);
}

// parents[i] where it precedes i, else -1 (the CPU op refuses such a parent).
__host__ __device__ inline int checked_parent(const BudgetTree& tree, int i) {
  const int64_t parent = tree.parents[i];
  return parent >= 0 && parent < i ? static_cast<int>(parent) : -1;
}

}  // namespace ddtree::cuda
