// DeepSeek-V3 routing on the CPU, each row alone (contract: kernels/ops.py): scores, the group filter, the top-k by a
// total order (larger first, NaN above every number, ties to the lower id) and the weights, in one pass per row.
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "../checks.h"
#include "../route_exp.h"
#include "cpu_ops.h"

namespace ddtree::cpu {
namespace {

// Whether (a, i) comes before (b, j): the larger value first, NaN before every number, ties to the lower index.
bool before(float a, int64_t i, float b, int64_t j) {
  const bool a_nan = std::isnan(a), b_nan = std::isnan(b);
  if (a_nan != b_nan) return a_nan;
  if (!a_nan && a != b) return a > b;
  return i < j;
}

// The first `take` indices of values[0 .. n) in that order.
void best(const float* values, int64_t n, int64_t take, std::vector<int64_t>& order) {
  order.resize(n);
  std::iota(order.begin(), order.end(), int64_t{0});
  std::partial_sort(order.begin(), order.begin() + take, order.end(),
                    [values](int64_t i, int64_t j) { return before(values[i], i, values[j], j); });
  order.resize(take);
}

constexpr int kChains = 32;  // a softmax row's sum: the lanes of the CUDA kernel's warp

struct Routing {
  int64_t top_k, num_groups, top_groups;
  bool softmax, normalize;
  float scaling;
};

void route_row(const float* logits, const float* bias, int64_t num_experts, const Routing& r, int64_t* idx,
               float* weights, std::vector<float>& scores, std::vector<float>& choice, std::vector<int64_t>& order) {
  scores.resize(num_experts);
  if (r.softmax) {
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t e = 0; e < num_experts; ++e) top = std::max(top, logits[e]);
    // the sum in the CUDA kernel's order: 32 chains of every 32nd expert, then a butterfly over them
    float chains[kChains] = {};
    for (int64_t e = 0; e < num_experts; ++e) chains[e % kChains] += scores[e] = route_exp(logits[e] - top);
    for (int offset = kChains / 2; offset > 0; offset /= 2) {
      float folded[kChains];
      for (int lane = 0; lane < kChains; ++lane) folded[lane] = chains[lane] + chains[lane ^ offset];
      std::copy(folded, folded + kChains, chains);
    }
    for (int64_t e = 0; e < num_experts; ++e) scores[e] /= chains[0];
  } else {
    for (int64_t e = 0; e < num_experts; ++e) scores[e] = 1.0f / (1.0f + route_exp(-logits[e]));
  }
  choice.resize(num_experts);
  for (int64_t e = 0; e < num_experts; ++e) choice[e] = scores[e] + bias[e];
  if (r.num_groups > 1) {
    const int64_t per_group = num_experts / r.num_groups, take = std::min<int64_t>(2, per_group);
    std::vector<float> group_scores(r.num_groups);
    for (int64_t g = 0; g < r.num_groups; ++g) {
      best(choice.data() + g * per_group, per_group, take, order);
      float sum = 0.0f;
      for (int64_t j : order) sum += choice[g * per_group + j];
      group_scores[g] = sum;
    }
    best(group_scores.data(), r.num_groups, r.top_groups, order);
    std::vector<bool> kept(r.num_groups, false);
    for (int64_t g : order) kept[g] = true;
    for (int64_t e = 0; e < num_experts; ++e) {
      if (!kept[e / per_group]) choice[e] = -std::numeric_limits<float>::infinity();
    }
  }
  best(choice.data(), num_experts, r.top_k, order);
  float total = 0.0f;
  for (int64_t j = 0; j < r.top_k; ++j) {
    idx[j] = order[j];
    weights[j] = scores[order[j]];
    total += weights[j];
  }
  for (int64_t j = 0; j < r.top_k; ++j) {
    if (r.normalize) weights[j] /= total + 1e-20f;
    weights[j] *= r.scaling;
  }
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> moe_route(const at::Tensor& logits, const at::Tensor& bias, int64_t top_k,
                                             int64_t num_groups, int64_t top_groups, bool softmax, bool normalize,
                                             double scaling, const std::optional<at::Tensor>& counts,
                                             const std::optional<at::Tensor>& real) {
  check_moe_route_args(logits, bias, top_k, num_groups, top_groups, counts, real);
  const int64_t num_rows = logits.size(0), num_experts = logits.size(1);
  at::Tensor idx = at::empty({num_rows, top_k}, logits.options().dtype(at::kLong));
  at::Tensor weights = at::empty({num_rows, top_k}, logits.options());
  const Routing routing{top_k, num_groups, top_groups, softmax, normalize, static_cast<float>(scaling)};
  const float* src = logits.const_data_ptr<float>();
  const float* b = bias.const_data_ptr<float>();
  int64_t* chosen = idx.mutable_data_ptr<int64_t>();
  float* w = weights.mutable_data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, 32768 / num_experts);
  at::parallel_for(0, num_rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, choice;
    std::vector<int64_t> order;
    for (int64_t n = begin; n < end; ++n) {
      route_row(src + n * num_experts, b, num_experts, routing, chosen + n * top_k, w + n * top_k, scores, choice,
                order);
    }
  });
  if (counts.has_value()) {
    int32_t* count = counts->mutable_data_ptr<int32_t>();
    const bool* is_real = real.has_value() ? real->const_data_ptr<bool>() : nullptr;
    for (int64_t n = 0; n < num_rows; ++n) {
      if (is_real != nullptr && !is_real[n]) continue;
      for (int64_t j = 0; j < top_k; ++j) ++count[chosen[n * top_k + j]];
    }
  }
  return {idx, weights};
}

}  // namespace ddtree::cpu
