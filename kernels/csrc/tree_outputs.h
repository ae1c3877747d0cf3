// The output tensors of tree_build, allocated the same way by its CPU and CUDA implementations.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <cstdint>
#include <tuple>

namespace ddtree {

// tokens, parents, depths, ranks [B+1] int64; scores [B+1] in the draft's dtype; visibility [B+1, B+1] bool.
using TreeBuildOutputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// Uninitialised outputs on the draft's device: each implementation writes every element (or clears first).
inline TreeBuildOutputs empty_tree_build_outputs(const at::Tensor& draft_logprobs, int64_t budget) {
  const int64_t num_nodes = budget + 1;
  const auto long_opts = draft_logprobs.options().dtype(at::kLong);
  return {at::empty({num_nodes}, long_opts),
          at::empty({num_nodes}, long_opts),
          at::empty({num_nodes}, long_opts),
          at::empty({num_nodes}, long_opts),
          at::empty({num_nodes}, draft_logprobs.options()),
          at::empty({num_nodes, num_nodes}, draft_logprobs.options().dtype(at::kBool))};
}

}  // namespace ddtree
