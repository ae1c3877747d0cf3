// CPU implementations of the ddtree ops; ops.cpp registers them under TORCH_LIBRARY_IMPL(ddtree, CPU, m).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <tuple>

#include "../tree_outputs.h"

namespace ddtree::cpu {

TreeBuildOutputs tree_build(const at::Tensor& draft_logprobs, const at::Tensor& root_token, int64_t budget,
                            const std::optional<at::Tensor>& budget_limit);

std::tuple<at::Tensor, at::Tensor> verify_attn(const at::Tensor& q_lat, const at::Tensor& q_pe, const at::Tensor& ckv,
                                               const at::Tensor& kpe, const at::Tensor& prefix_len,
                                               const at::Tensor& block_mask, double scale, bool batch_invariant);

std::tuple<at::Tensor, at::Tensor, at::Tensor> tree_accept(const at::Tensor& tokens, const at::Tensor& parents,
                                                           const at::Tensor& target, int64_t max_depth);

void kv_compact(const at::Tensor& ckv, const at::Tensor& kpe, const at::Tensor& prefix_len, const at::Tensor& path);

void commit_path(const at::Tensor& target, const at::Tensor& path, const at::Tensor& path_len, const at::Tensor& bonus,
                 const at::Tensor& generated, const at::Tensor& num_generated, const at::Tensor& root,
                 const at::Tensor& prefix_len);

std::tuple<at::Tensor, at::Tensor, at::Tensor> budget_choose(const at::Tensor& scores, const at::Tensor& parents,
                                                             const at::Tensor& depths, const at::Tensor& ranks,
                                                             const at::Tensor& realised, const at::Tensor& predicted,
                                                             const at::Tensor& buckets, const at::Tensor& seconds);

void confidence_learn(const at::Tensor& realised, const at::Tensor& predicted, const at::Tensor& parents,
                      const at::Tensor& depths, const at::Tensor& ranks, const at::Tensor& scores,
                      const at::Tensor& path);

at::Tensor linear_rows(const at::Tensor& x, const at::Tensor& packed, int64_t out_features,
                       const std::optional<at::Tensor>& group_ends);

at::Tensor rms_norm_rows(const at::Tensor& x, const at::Tensor& weight, double eps);

std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight,
                                                double eps);

at::Tensor silu_mul(const at::Tensor& gate_up);

at::Tensor router_logits(const at::Tensor& x, const at::Tensor& weight);

std::tuple<at::Tensor, at::Tensor, at::Tensor> expert_rows(const at::Tensor& x, const at::Tensor& idx,
                                                           int64_t num_experts);

at::Tensor expert_combine(const at::Tensor& out, const at::Tensor& slots, const at::Tensor& weights,
                          const at::Tensor& group_ends);

std::tuple<at::Tensor, at::Tensor> moe_route(const at::Tensor& logits, const at::Tensor& bias, int64_t top_k,
                                             int64_t num_groups, int64_t top_groups, bool softmax, bool normalize,
                                             double scaling, const std::optional<at::Tensor>& counts,
                                             const std::optional<at::Tensor>& real);

at::Tensor cache_attn(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                      const at::Tensor& num_visible, double scale);

at::Tensor head_norm_rope(const at::Tensor& x, const std::optional<at::Tensor>& weight, const at::Tensor& cos,
                          const at::Tensor& sin, double eps, bool interleave);

void latent_write(const at::Tensor& kv, const at::Tensor& weight, const at::Tensor& cos, const at::Tensor& sin,
                  double eps, bool interleave, const at::Tensor& ckv, const at::Tensor& kpe, const at::Tensor& rows);

void context_write(const at::Tensor& kv, const at::Tensor& k_norm, const at::Tensor& rope, const at::Tensor& start,
                   double eps, const at::Tensor& keys, const at::Tensor& values);

}  // namespace ddtree::cpu
