// What the budget policy's CPU ops (budget_choose.cpp, confidence_learn.cpp) share: the value checks of the tree
// they read and the confidence cell a node's evidence lands in (contracts: kernels/ops.py).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>

namespace ddtree::cpu {

// Raises unless every parent precedes its node (or is -1), every depth has a row in tables of `num_depths`
// rows and every rank is >= 0: the values the ops index with.
inline void check_budget_tree_values(const at::Tensor& parents, const at::Tensor& depths, const at::Tensor& ranks,
                                     int64_t num_depths) {
  const int64_t* par = parents.const_data_ptr<int64_t>();
  const int64_t* dep = depths.const_data_ptr<int64_t>();
  const int64_t* rnk = ranks.const_data_ptr<int64_t>();
  for (int64_t i = 0; i < parents.size(0); ++i) {
    TORCH_CHECK(par[i] >= -1 && par[i] < i, "parents[", i, "] = ", par[i], " must be -1 or a node index below ", i,
                " (tree_build's pop order: node 0 is the root, parents before children)");
    TORCH_CHECK(dep[i] >= 0 && dep[i] < num_depths, "depths[", i, "] = ", dep[i],
                " has no row in the confidence tables of L + 1 = ", num_depths,
                " rows (realised.size(0)): make them one row per depth, 0..L");
    TORCH_CHECK(rnk[i] >= 0, "ranks[", i, "] = ", rnk[i], " must be >= 0 (a token's index among its depth's "
                "candidates)");
  }
}

// Row-major index into the [L + 1, C] tables of a node at `depth` (checked) with `rank`: class min(rank, C - 1).
inline int64_t confidence_cell(int64_t depth, int64_t rank, int64_t num_classes) {
  return depth * num_classes + std::min(rank, num_classes - 1);
}

}  // namespace ddtree::cpu
