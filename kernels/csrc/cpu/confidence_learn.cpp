// One verified tree's evidence added to the budget policy's confidence tables, on the CPU (contract: kernels/ops.py).
#include <cmath>
#include <vector>

#include "../checks.h"
#include "budget_tree.h"
#include "cpu_ops.h"

namespace ddtree::cpu {

void confidence_learn(const at::Tensor& realised, const at::Tensor& predicted, const at::Tensor& parents,
                      const at::Tensor& depths, const at::Tensor& ranks, const at::Tensor& scores,
                      const at::Tensor& path) {
  check_confidence_learn_args(realised, predicted, parents, depths, ranks, scores, path);
  const int64_t num_nodes = scores.size(0);
  const int64_t num_classes = realised.size(1);
  check_budget_tree_values(parents, depths, ranks, realised.size(0));
  std::vector<bool> on_path(num_nodes, false);
  const int64_t* accepted = path.const_data_ptr<int64_t>();
  for (int64_t m = 0; m < path.size(0); ++m) {
    TORCH_CHECK(accepted[m] >= -1 && accepted[m] < num_nodes, "path[", m, "] = ", accepted[m],
                " is neither a node index in [0, ", num_nodes, ") nor the -1 padding (pass tree_accept's path of "
                "this tree)");
    if (accepted[m] >= 0) on_path[accepted[m]] = true;
  }

  const float* score = scores.const_data_ptr<float>();
  const int64_t* par = parents.const_data_ptr<int64_t>();
  const int64_t* dep = depths.const_data_ptr<int64_t>();
  const int64_t* rnk = ranks.const_data_ptr<int64_t>();
  float* real = realised.mutable_data_ptr<float>();
  float* pred = predicted.mutable_data_ptr<float>();
  for (int64_t i = 0; i < num_nodes; ++i) {
    if (dep[i] == 0) continue;
    const int64_t cell = confidence_cell(dep[i], rnk[i], num_classes);
    if (par[i] >= 0 && on_path[par[i]]) pred[cell] += std::exp(score[i] - score[par[i]]);
    if (on_path[i]) real[cell] += 1.0f;
  }
}

}  // namespace ddtree::cpu
