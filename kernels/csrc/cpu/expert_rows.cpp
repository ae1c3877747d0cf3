// The routed experts' rows on the CPU (contract: kernels/ops.py): expert_rows groups the token-expert assignments by
// expert with a counting sort, expert_combine sums each token's k outputs back in rank order.
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "../checks.h"
#include "cpu_ops.h"

namespace ddtree::cpu {

std::tuple<at::Tensor, at::Tensor, at::Tensor> expert_rows(const at::Tensor& x, const at::Tensor& idx,
                                                           int64_t num_experts) {
  check_expert_rows_args(x, idx, num_experts);
  const int64_t num_tokens = idx.size(0), top_k = idx.size(1), num_assignments = num_tokens * top_k;
  const int64_t* ids = idx.const_data_ptr<int64_t>();
  std::vector<int64_t> starts(num_experts + 2, 0);  // counts, then each id's first row; id E: no expert here
  for (int64_t j = 0; j < num_assignments; ++j) {
    TORCH_CHECK(ids[j] >= 0 && ids[j] <= num_experts, "idx[", j / top_k, ", ", j % top_k, "] = ", ids[j],
                " is not an expert in [0, ", num_experts, "] (", num_experts, ": another rank's)");
    ++starts[ids[j] + 1];
  }
  for (int64_t e = 1; e <= num_experts + 1; ++e) starts[e] += starts[e - 1];
  at::Tensor group_ends = at::empty({num_experts}, idx.options().dtype(at::kInt));
  int32_t* ends = group_ends.mutable_data_ptr<int32_t>();
  for (int64_t e = 0; e < num_experts; ++e) ends[e] = static_cast<int32_t>(starts[e + 1]);
  at::Tensor rows = at::empty({num_assignments, x.size(1)}, x.options());
  at::Tensor slots = at::empty({num_tokens, top_k}, idx.options());
  int64_t* slot = slots.mutable_data_ptr<int64_t>();
  const auto row_bytes = static_cast<size_t>(x.size(1) * x.element_size());
  const auto* src = static_cast<const char*>(x.const_data_ptr());
  auto* dst = static_cast<char*>(rows.mutable_data_ptr());
  for (int64_t j = 0; j < num_assignments; ++j) {  // in token-major order: stable within an expert
    slot[j] = starts[ids[j]]++;
    std::memcpy(dst + slot[j] * row_bytes, src + (j / top_k) * x.stride(0) * x.element_size(), row_bytes);
  }
  return {rows, slots, group_ends};
}

namespace {

// y[n] = sum over r of weights[n, r] * out[slots[n, r]] in float32, r in order; a slot at or past num_held (an
// assignment to no expert here) adds nothing.
template <typename T>
void combine(const at::Tensor& out, const at::Tensor& slots, const at::Tensor& weights, int64_t num_held,
             at::Tensor& y) {
  const int64_t num_tokens = slots.size(0), top_k = slots.size(1), width = out.size(1);
  const int64_t* slot = slots.const_data_ptr<int64_t>();
  const float* weight = weights.const_data_ptr<float>();
  const T* rows = out.const_data_ptr<T>();
  T* dst = y.mutable_data_ptr<T>();
  std::vector<float> acc(width);
  for (int64_t n = 0; n < num_tokens; ++n) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t r = 0; r < top_k; ++r) {
      const int64_t s = slot[n * top_k + r];
      if (s >= num_held) continue;
      TORCH_CHECK(s >= 0, "slots[", n, ", ", r, "] = ", s, " is not a row of out (M = ", out.size(0), ")");
      const float w = weight[n * top_k + r];
      const T* row = rows + s * out.stride(0);
      for (int64_t h = 0; h < width; ++h) acc[h] += w * static_cast<float>(row[h]);
    }
    for (int64_t h = 0; h < width; ++h) dst[n * width + h] = static_cast<T>(acc[h]);
  }
}

}  // namespace

at::Tensor expert_combine(const at::Tensor& out, const at::Tensor& slots, const at::Tensor& weights,
                          const at::Tensor& group_ends) {
  check_expert_combine_args(out, slots, weights, group_ends);
  const int64_t num_held = group_ends.const_data_ptr<int32_t>()[group_ends.size(0) - 1];
  TORCH_CHECK(num_held >= 0 && num_held <= out.size(0), "group_ends[-1] = ", num_held, " must be in [0, M = ",
              out.size(0), "] (the rows out holds)");
  at::Tensor y = at::empty({slots.size(0), out.size(1)}, out.options());
  if (out.scalar_type() == at::kFloat) {
    combine<float>(out, slots, weights, num_held, y);
  } else {
    combine<c10::BFloat16>(out, slots, weights, num_held, y);
  }
  return y;
}

}  // namespace ddtree::cpu
