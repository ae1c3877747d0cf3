// The budget policy's choice among a step's budget buckets, on the CPU (contract: kernels/ops.py).
#include <ATen/ops/empty.h>

#include <cmath>
#include <vector>

#include "../checks.h"
#include "budget_tree.h"
#include "cpu_ops.h"

namespace ddtree::cpu {
namespace {

void check_choose_values(const at::Tensor& scores, const at::Tensor& buckets, const at::Tensor& seconds) {
  const float* score = scores.const_data_ptr<float>();
  for (int64_t i = 0; i < scores.size(0); ++i) {
    TORCH_CHECK(!std::isnan(score[i]), "scores has NaN at node ", i, ": the draft's cumulative log-probabilities must "
                "be numbers (-inf for padding nodes)");
  }
  const int64_t* bucket = buckets.const_data_ptr<int64_t>();
  const float* second = seconds.const_data_ptr<float>();
  for (int64_t k = 0; k < buckets.size(0); ++k) {
    TORCH_CHECK(bucket[k] >= 0 && bucket[k] < scores.size(0), "buckets[", k, "] = ", bucket[k],
                " must be a budget in [0, N - 1] = [0, ", scores.size(0) - 1, "] (the tree has N = ", scores.size(0),
                " nodes)");
    TORCH_CHECK(std::isfinite(second[k]) && second[k] > 0, "seconds[", k, "] = ", second[k],
                " must be a finite time > 0 (the step's predicted seconds at bucket ", bucket[k], ")");
  }
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> budget_choose(const at::Tensor& scores, const at::Tensor& parents,
                                                             const at::Tensor& depths, const at::Tensor& ranks,
                                                             const at::Tensor& realised, const at::Tensor& predicted,
                                                             const at::Tensor& buckets, const at::Tensor& seconds) {
  check_budget_choose_args(scores, parents, depths, ranks, realised, predicted, buckets, seconds);
  const int64_t num_depths = realised.size(0);
  const int64_t num_classes = realised.size(1);
  check_budget_tree_values(parents, depths, ranks, num_depths);
  check_choose_values(scores, buckets, seconds);

  const int64_t num_nodes = scores.size(0);
  const float* score = scores.const_data_ptr<float>();
  const int64_t* par = parents.const_data_ptr<int64_t>();
  const int64_t* dep = depths.const_data_ptr<int64_t>();
  const int64_t* rnk = ranks.const_data_ptr<int64_t>();
  const float* real = realised.const_data_ptr<float>();
  const float* pred = predicted.const_data_ptr<float>();
  std::vector<float> own(num_nodes);  // log(realised / predicted) at the node's cell; 0 at depth 0
  for (int64_t i = 0; i < num_nodes; ++i) {
    const int64_t cell = confidence_cell(dep[i], rnk[i], num_classes);
    own[i] = dep[i] == 0 ? 0.0f : std::log(real[cell] / pred[cell]);
  }
  std::vector<float> cumulative(num_nodes);  // p_0 + ... + p_i
  float total = 0.0f;
  for (int64_t i = 0; i < num_nodes; ++i) {
    float path = 0.0f;  // the node's own factor, then its ancestors' (the order the CUDA kernel sums in)
    for (int64_t j = i; j != -1; j = par[j]) path += own[j];
    const float accept = std::exp(score[i] + path);
    total += accept > 1.0f ? 1.0f : accept;  // the cap keeps NaN
    cumulative[i] = total;
  }

  const int64_t num_buckets = buckets.size(0);
  at::Tensor expected = at::empty({num_buckets}, seconds.options());
  at::Tensor value = at::empty({num_buckets}, seconds.options());
  at::Tensor chosen = at::empty({}, buckets.options());
  const int64_t* bucket = buckets.const_data_ptr<int64_t>();
  const float* second = seconds.const_data_ptr<float>();
  float* expected_p = expected.mutable_data_ptr<float>();
  float* value_p = value.mutable_data_ptr<float>();
  int64_t best = -1;
  for (int64_t k = 0; k < num_buckets; ++k) {
    expected_p[k] = cumulative[bucket[k]] - 1.0f;
    value_p[k] = (1.0f + expected_p[k]) / second[k];
    if (!std::isnan(value_p[k]) && (best < 0 || value_p[k] > value_p[best])) best = k;
  }
  *chosen.mutable_data_ptr<int64_t>() = best < 0 ? 0 : best;
  return {chosen, expected, value};
}

}  // namespace ddtree::cpu
