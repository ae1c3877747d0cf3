// Greedy acceptance walk down the verified tree, on the CPU (contract: kernels/ops.py).
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>

#include "../checks.h"
#include "cpu_ops.h"

namespace ddtree::cpu {

std::tuple<at::Tensor, at::Tensor, at::Tensor> tree_accept(const at::Tensor& tokens, const at::Tensor& parents,
                                                           const at::Tensor& target, int64_t max_depth) {
  check_tree_accept_args(tokens, parents, target, max_depth);
  const int64_t num_nodes = tokens.size(0);
  const int64_t* tok = tokens.const_data_ptr<int64_t>();
  const int64_t* par = parents.const_data_ptr<int64_t>();
  const int64_t* tgt = target.const_data_ptr<int64_t>();
  for (int64_t c = 0; c < num_nodes; ++c) {
    TORCH_CHECK(par[c] >= -1 && par[c] < c, "parents[", c, "] = ", par[c], " must be -1 or a node index below ", c,
                " (nodes come in pop order: node 0 is the root, parents before children)");
  }

  const int64_t path_capacity = max_depth + 1;
  at::Tensor path = at::full({path_capacity}, -1, tokens.options());
  int64_t* out = path.mutable_data_ptr<int64_t>();
  int64_t current = 0;
  int64_t path_len = 1;
  out[0] = 0;
  for (;;) {
    int64_t next = -1;
    for (int64_t c = current + 1; c < num_nodes; ++c) {
      if (par[c] == current && tok[c] == tgt[current]) {
        next = c;
        break;
      }
    }
    if (next < 0) break;
    TORCH_CHECK(path_len < path_capacity, "the accepted path is longer than max_depth + 1 = ", path_capacity,
                " nodes; pass max_depth >= the depth of the tree (the drafter's block length L)");
    out[path_len++] = next;
    current = next;
  }

  at::Tensor path_len_t = at::empty({}, tokens.options());
  at::Tensor bonus = at::empty({}, tokens.options());
  *path_len_t.mutable_data_ptr<int64_t>() = path_len;
  *bonus.mutable_data_ptr<int64_t>() = tgt[current];
  return {path, path_len_t, bonus};
}

}  // namespace ddtree::cpu
