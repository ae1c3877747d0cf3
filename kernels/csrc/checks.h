// Argument checks shared by the CPU and CUDA bindings of the ddtree ops.
//
// These read only tensor metadata (dtype, shape, strides, device), never tensor values, so a CUDA
// binding can call them without a host synchronisation. Checks on values (NaN, prefix_len + N <= S,
// root_token >= 0, path order) live in the CPU kernels, where reading values is free.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace ddtree {

constexpr int64_t kMaxBudget = 1024;

// "float32", "int64", ...: the names Python users know.
// getDtypeNames returns strings (torch 2.11) or views (2.13) by value: copy, never view the temporary.
inline std::string dtype_name(at::ScalarType dtype) { return std::string(c10::getDtypeNames(dtype).first); }

inline void check_dtype(const at::Tensor& t, at::ScalarType dtype, const char* name) {
  TORCH_CHECK(t.scalar_type() == dtype, name, " must be ", dtype_name(dtype), ", got ", dtype_name(t.scalar_type()));
}

inline void check_shape(const at::Tensor& t, int64_t dim, const char* name, const char* layout) {
  TORCH_CHECK(t.dim() == dim, name, " must be ", dim, "-dim ", layout, ", got shape ", t.sizes());
}

inline void check_contiguous(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous (call .contiguous() on it), got shape ", t.sizes(),
              " with strides ", t.strides());
}

inline void check_index_scalar(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 0 && t.scalar_type() == at::kLong, name,
              " must be a 0-dim int64 tensor (e.g. torch.tensor(5)), got ", dtype_name(t.scalar_type()), " of shape ",
              t.sizes());
}

inline void check_same_device(const at::Tensor& t, const at::Tensor& ref, const char* name, const char* ref_name) {
  TORCH_CHECK(t.device() == ref.device(), name, " is on ", t.device(), " but ", ref_name, " is on ", ref.device(),
              "; move all arguments of the op to one device");
}

inline void check_tree_build_args(const at::Tensor& draft_logprobs, const at::Tensor& root_token, int64_t budget) {
  check_dtype(draft_logprobs, at::kFloat, "draft_logprobs");
  check_shape(draft_logprobs, 2, "draft_logprobs", "[L, V]");
  TORCH_CHECK(draft_logprobs.size(0) >= 1 && draft_logprobs.size(1) >= 1,
              "draft_logprobs [L, V] needs L >= 1 and V >= 1, got shape ", draft_logprobs.sizes());
  check_contiguous(draft_logprobs, "draft_logprobs");
  check_index_scalar(root_token, "root_token");
  check_same_device(root_token, draft_logprobs, "root_token", "draft_logprobs");
  TORCH_CHECK(budget >= 0 && budget <= kMaxBudget, "budget must be in [0, ", kMaxBudget, "], got ", budget);
}

// tree_build's optional budget_limit: a 0-dim int64 on the draft's device (its value is checked by the CPU op).
inline void check_budget_limit(const std::optional<at::Tensor>& budget_limit, const at::Tensor& draft_logprobs) {
  if (!budget_limit.has_value()) return;
  check_index_scalar(*budget_limit, "budget_limit");
  check_same_device(*budget_limit, draft_logprobs, "budget_limit", "draft_logprobs");
}

inline void check_verify_attn_args(const at::Tensor& q_lat, const at::Tensor& q_pe, const at::Tensor& ckv,
                                   const at::Tensor& kpe, const at::Tensor& prefix_len,
                                   const at::Tensor& block_mask) {
  TORCH_CHECK(q_lat.scalar_type() == at::kFloat || q_lat.scalar_type() == at::kBFloat16,
              "q_lat must be float32 or bfloat16, got ", dtype_name(q_lat.scalar_type()));
  check_dtype(q_pe, q_lat.scalar_type(), "q_pe (same dtype as q_lat)");
  check_dtype(ckv, q_lat.scalar_type(), "ckv (same dtype as q_lat)");
  check_dtype(kpe, q_lat.scalar_type(), "kpe (same dtype as q_lat)");
  check_dtype(block_mask, at::kBool, "block_mask");
  check_shape(q_lat, 3, "q_lat", "[N, H, R]");
  check_shape(q_pe, 3, "q_pe", "[N, H, P]");
  check_shape(ckv, 2, "ckv", "[S, R]");
  check_shape(kpe, 2, "kpe", "[S, P]");
  check_shape(block_mask, 2, "block_mask", "[N, N]");
  const int64_t num_nodes = q_lat.size(0);
  TORCH_CHECK(q_pe.size(0) == num_nodes && q_pe.size(1) == q_lat.size(1),
              "q_pe [N, H, P] must match q_lat [N, H, R] in N and H, got q_pe ", q_pe.sizes(), " and q_lat ",
              q_lat.sizes());
  TORCH_CHECK(ckv.size(1) == q_lat.size(2), "ckv [S, R] must have R = q_lat.size(2) = ", q_lat.size(2), ", got ckv ",
              ckv.sizes());
  TORCH_CHECK(kpe.size(1) == q_pe.size(2), "kpe [S, P] must have P = q_pe.size(2) = ", q_pe.size(2), ", got kpe ",
              kpe.sizes());
  TORCH_CHECK(kpe.size(0) == ckv.size(0), "kpe [S, P] and ckv [S, R] must have the same S, got kpe ", kpe.sizes(),
              " and ckv ", ckv.sizes());
  TORCH_CHECK(block_mask.size(0) == num_nodes && block_mask.size(1) == num_nodes,
              "block_mask must be [N, N] with N = q_lat.size(0) = ", num_nodes, ", got ", block_mask.sizes());
  TORCH_CHECK(num_nodes <= ckv.size(0), "the block of N = ", num_nodes, " nodes does not fit in the cache of S = ",
              ckv.size(0), " rows (need prefix_len + N <= S)");
  check_index_scalar(prefix_len, "prefix_len");
  check_contiguous(q_lat, "q_lat");
  check_contiguous(q_pe, "q_pe");
  check_contiguous(ckv, "ckv");
  check_contiguous(kpe, "kpe");
  check_contiguous(block_mask, "block_mask");
  check_same_device(q_pe, q_lat, "q_pe", "q_lat");
  check_same_device(ckv, q_lat, "ckv", "q_lat");
  check_same_device(kpe, q_lat, "kpe", "q_lat");
  check_same_device(prefix_len, q_lat, "prefix_len", "q_lat");
  check_same_device(block_mask, q_lat, "block_mask", "q_lat");
}

inline void check_tree_accept_args(const at::Tensor& tokens, const at::Tensor& parents, const at::Tensor& target,
                                   int64_t max_depth) {
  check_dtype(tokens, at::kLong, "tokens");
  check_dtype(parents, at::kLong, "parents");
  check_dtype(target, at::kLong, "target");
  check_shape(tokens, 1, "tokens", "[N]");
  TORCH_CHECK(tokens.size(0) >= 1, "tokens must hold at least the root node, got shape ", tokens.sizes());
  TORCH_CHECK(parents.sizes() == tokens.sizes() && target.sizes() == tokens.sizes(),
              "tokens, parents and target must all be [N], got ", tokens.sizes(), ", ", parents.sizes(), " and ",
              target.sizes());
  check_contiguous(tokens, "tokens");
  check_contiguous(parents, "parents");
  check_contiguous(target, "target");
  check_same_device(parents, tokens, "parents", "tokens");
  check_same_device(target, tokens, "target", "tokens");
  TORCH_CHECK(max_depth >= 0, "max_depth must be >= 0 (the drafter's block length L), got ", max_depth);
}

inline void check_kv_compact_args(const at::Tensor& ckv, const at::Tensor& kpe, const at::Tensor& prefix_len,
                                  const at::Tensor& path) {
  check_shape(ckv, 3, "ckv", "[num_layers, S, R]");
  check_shape(kpe, 3, "kpe", "[num_layers, S, P]");
  TORCH_CHECK(ckv.size(0) == kpe.size(0) && ckv.size(1) == kpe.size(1),
              "ckv [num_layers, S, R] and kpe [num_layers, S, P] must agree in num_layers and S, got ", ckv.sizes(),
              " and ", kpe.sizes());
  check_contiguous(ckv, "ckv");
  check_contiguous(kpe, "kpe");
  check_index_scalar(prefix_len, "prefix_len");
  check_dtype(path, at::kLong, "path");
  check_shape(path, 1, "path", "[max_depth + 1]");
  check_contiguous(path, "path");
  check_same_device(kpe, ckv, "kpe", "ckv");
  check_same_device(prefix_len, ckv, "prefix_len", "ckv");
  check_same_device(path, ckv, "path", "ckv");
}

// commit_path: target [N] and path [P] int64 at any stride, P >= 1; generated [G] int64 contiguous; path_len, bonus,
// num_generated, root and prefix_len 0-dim int64; all on target's device.
inline void check_commit_path_args(const at::Tensor& target, const at::Tensor& path, const at::Tensor& path_len,
                                   const at::Tensor& bonus, const at::Tensor& generated,
                                   const at::Tensor& num_generated, const at::Tensor& root,
                                   const at::Tensor& prefix_len) {
  check_dtype(target, at::kLong, "target");
  check_shape(target, 1, "target", "[N] (the target's token at every verified node)");
  check_dtype(path, at::kLong, "path");
  check_shape(path, 1, "path", "[P] (tree_accept's path)");
  TORCH_CHECK(path.size(0) >= 1, "path must hold at least the root's entry (P >= 1), got shape ", path.sizes());
  check_dtype(generated, at::kLong, "generated");
  check_shape(generated, 1, "generated", "[G] (the generated tokens)");
  check_contiguous(generated, "generated");
  check_same_device(path, target, "path", "target");
  check_same_device(generated, target, "generated", "target");
  for (const auto& [t, name] : {std::pair{&path_len, "path_len"}, std::pair{&bonus, "bonus"},
                                std::pair{&num_generated, "num_generated"}, std::pair{&root, "root"},
                                std::pair{&prefix_len, "prefix_len"}}) {
    check_index_scalar(*t, name);
    check_same_device(*t, target, name, "target");
  }
}

// The tree of the budget policy's ops: tree_build's scores [N] f32 and parents, depths, ranks [N] i64.
inline void check_budget_tree_args(const at::Tensor& scores, const at::Tensor& parents, const at::Tensor& depths,
                                   const at::Tensor& ranks) {
  check_dtype(scores, at::kFloat, "scores");
  check_dtype(parents, at::kLong, "parents");
  check_dtype(depths, at::kLong, "depths");
  check_dtype(ranks, at::kLong, "ranks");
  check_shape(scores, 1, "scores", "[N]");
  TORCH_CHECK(scores.size(0) >= 1, "scores must hold at least the root node, got shape ", scores.sizes());
  TORCH_CHECK(parents.sizes() == scores.sizes() && depths.sizes() == scores.sizes() && ranks.sizes() == scores.sizes(),
              "scores, parents, depths and ranks must all be [N] (tree_build's outputs), got ", scores.sizes(), ", ",
              parents.sizes(), ", ", depths.sizes(), " and ", ranks.sizes());
  check_contiguous(scores, "scores");
  check_contiguous(parents, "parents");
  check_contiguous(depths, "depths");
  check_contiguous(ranks, "ranks");
  check_same_device(parents, scores, "parents", "scores");
  check_same_device(depths, scores, "depths", "scores");
  check_same_device(ranks, scores, "ranks", "scores");
}

// The confidence tables realised, predicted [L + 1, C] f32: one row per depth, one column per rank class.
inline void check_confidence_tables(const at::Tensor& realised, const at::Tensor& predicted, const at::Tensor& scores) {
  check_dtype(realised, at::kFloat, "realised");
  check_dtype(predicted, at::kFloat, "predicted");
  check_shape(realised, 2, "realised", "[L + 1, C]");
  TORCH_CHECK(realised.size(0) >= 1 && realised.size(1) >= 1,
              "realised [L + 1, C] needs at least one depth row and one rank class, got shape ", realised.sizes());
  TORCH_CHECK(predicted.sizes() == realised.sizes(), "predicted must have realised's shape [L + 1, C] = ",
              realised.sizes(), ", got ", predicted.sizes());
  check_contiguous(realised, "realised");
  check_contiguous(predicted, "predicted");
  check_same_device(realised, scores, "realised", "scores");
  check_same_device(predicted, scores, "predicted", "scores");
}

inline void check_budget_choose_args(const at::Tensor& scores, const at::Tensor& parents, const at::Tensor& depths,
                                     const at::Tensor& ranks, const at::Tensor& realised,
                                     const at::Tensor& predicted, const at::Tensor& buckets,
                                     const at::Tensor& seconds) {
  check_budget_tree_args(scores, parents, depths, ranks);
  check_confidence_tables(realised, predicted, scores);
  check_dtype(buckets, at::kLong, "buckets");
  check_dtype(seconds, at::kFloat, "seconds");
  check_shape(buckets, 1, "buckets", "[K]");
  TORCH_CHECK(buckets.size(0) >= 1, "buckets must list at least one budget, got shape ", buckets.sizes());
  TORCH_CHECK(seconds.sizes() == buckets.sizes(), "seconds must be [K], one per bucket, with K = buckets.size(0) = ",
              buckets.size(0), ", got ", seconds.sizes());
  check_contiguous(buckets, "buckets");
  check_contiguous(seconds, "seconds");
  check_same_device(buckets, scores, "buckets", "scores");
  check_same_device(seconds, scores, "seconds", "scores");
}

inline void check_confidence_learn_args(const at::Tensor& realised, const at::Tensor& predicted,
                                        const at::Tensor& parents, const at::Tensor& depths, const at::Tensor& ranks,
                                        const at::Tensor& scores, const at::Tensor& path) {
  check_budget_tree_args(scores, parents, depths, ranks);
  check_confidence_tables(realised, predicted, scores);
  check_dtype(path, at::kLong, "path");
  check_shape(path, 1, "path", "[max_depth + 1]");
  check_contiguous(path, "path");
  check_same_device(path, scores, "path", "scores");
}

// linear_rows: x [M, G, K] (rows and groups at any stride, K contiguous); the G weights as kernels.ops.pack_linear_rows
// packs them for the device (the CPU: float32 [G, ceil(N / panel), K, panel]; CUDA: [G, N, K rounded up to 8] in x's
// dtype); group_ends: int32 [G] on x's device, with x [M, 1, K] (its values are checked by the CPU op).
inline void check_linear_rows_common(const at::Tensor& x, const at::Tensor& packed, int64_t out_features,
                                     const std::optional<at::Tensor>& group_ends) {
  check_shape(x, 3, "x", "[M, G, K]");
  TORCH_CHECK(x.stride(2) == 1 || x.size(2) <= 1, "x's last dimension (K) must be contiguous, got strides ",
              x.strides());
  check_contiguous(packed, "packed");
  check_same_device(packed, x, "packed", "x");
  TORCH_CHECK(out_features >= 0, "out_features must be >= 0, got ", out_features);
  if (!group_ends.has_value()) return;
  check_dtype(*group_ends, at::kInt, "group_ends");
  check_shape(*group_ends, 1, "group_ends", "[G]");
  check_same_device(*group_ends, x, "group_ends", "x");
  TORCH_CHECK(x.size(1) == 1, "with group_ends, x must be [M, 1, K] (each row through its group's weight), got ",
              x.sizes());
  TORCH_CHECK(group_ends->size(0) == packed.size(0) && packed.size(0) >= 1, "group_ends must hold one end per ",
              "packed weight (", packed.size(0), "), got ", group_ends->size(0));
}

inline void check_linear_rows_args(const at::Tensor& x, const at::Tensor& packed, int64_t out_features,
                                   const std::optional<at::Tensor>& group_ends, int64_t panel) {
  check_dtype(x, at::kFloat, "x");
  check_dtype(packed, at::kFloat, "packed");
  check_shape(packed, 4, "packed", "[G, ceil(N / 16), K, 16] (kernels.ops.pack_linear_rows)");
  check_linear_rows_common(x, packed, out_features, group_ends);
  const int64_t groups = group_ends.has_value() ? packed.size(0) : x.size(1);
  TORCH_CHECK(packed.size(0) == groups && packed.size(1) == (out_features + panel - 1) / panel &&
                  packed.size(2) == x.size(2) && packed.size(3) == panel,
              "packed must be [G, ceil(N / ", panel, "), K, ", panel, "] for G = ", groups, ", N = out_features = ",
              out_features, " and K = x.size(2) = ", x.size(2),
              " (pack the [G, N, K] weights with kernels.ops.pack_linear_rows), got ", packed.sizes());
}

// t float32 or bfloat16, 2-dim (`layout`), its rows contiguous (its last stride 1).
inline void check_float_rows(const at::Tensor& t, const char* name, const char* layout) {
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16, name,
              " must be float32 or bfloat16, got ", dtype_name(t.scalar_type()));
  check_shape(t, 2, name, layout);
  TORCH_CHECK(t.stride(1) == 1 || t.size(1) <= 1, name, "'s rows must be contiguous (its last stride 1), got strides ",
              t.strides());
}

constexpr int64_t kMaxExperts = 8191;  // expert_rows' and moe_route's CUDA kernels hold a row's experts in shared memory

// expert_rows: x [N, H] float32 or bfloat16 with contiguous rows, idx [N, k] int64 contiguous, 1 <= E <= kMaxExperts.
inline void check_expert_rows_args(const at::Tensor& x, const at::Tensor& idx, int64_t num_experts) {
  check_float_rows(x, "x", "[N, H]");
  check_dtype(idx, at::kLong, "idx");
  check_shape(idx, 2, "idx", "[N, k] (each token's experts)");
  check_contiguous(idx, "idx");
  check_same_device(idx, x, "idx", "x");
  TORCH_CHECK(idx.size(0) == x.size(0), "idx must hold one row of experts per row of x (", x.size(0), "), got ",
              idx.size(0));
  TORCH_CHECK(num_experts >= 1 && num_experts <= kMaxExperts, "num_experts must be in [1, ", kMaxExperts, "], got ",
              num_experts);
}

// moe_route: logits [N, E] float32 contiguous, bias [E] float32 contiguous, 1 <= E <= kMaxExperts; 1 <= top_k <=
// the experts top_groups of num_groups groups hold; counts [E] int32 contiguous and real [N] bool when given.
inline void check_moe_route_args(const at::Tensor& logits, const at::Tensor& bias, int64_t top_k, int64_t num_groups,
                                 int64_t top_groups, const std::optional<at::Tensor>& counts,
                                 const std::optional<at::Tensor>& real) {
  check_dtype(logits, at::kFloat, "logits");
  check_shape(logits, 2, "logits", "[N, E] (the router's logits)");
  check_contiguous(logits, "logits");
  const int64_t num_experts = logits.size(1);
  TORCH_CHECK(num_experts >= 1 && num_experts <= kMaxExperts, "logits must hold E in [1, ", kMaxExperts,
              "] experts per row, got shape ", logits.sizes());
  check_dtype(bias, at::kFloat, "bias");
  check_shape(bias, 1, "bias", "[E] (the correction bias)");
  check_contiguous(bias, "bias");
  TORCH_CHECK(bias.size(0) == num_experts, "bias must hold E = logits.size(1) = ", num_experts, " entries, got ",
              bias.size(0));
  check_same_device(bias, logits, "bias", "logits");
  TORCH_CHECK(num_groups >= 1 && num_experts % num_groups == 0, "num_groups must divide E = ", num_experts, ", got ",
              num_groups);
  TORCH_CHECK(top_groups >= 1 && top_groups <= num_groups, "top_groups must be in [1, num_groups = ", num_groups,
              "], got ", top_groups);
  const int64_t kept = top_groups * (num_experts / num_groups);
  TORCH_CHECK(top_k >= 1 && top_k <= kept, "top_k must be in [1, ", kept,
              "] (the experts top_groups of the groups hold), got ", top_k);
  if (counts.has_value()) {
    check_dtype(*counts, at::kInt, "counts");
    check_shape(*counts, 1, "counts", "[E]");
    check_contiguous(*counts, "counts");
    TORCH_CHECK(counts->size(0) == num_experts, "counts must hold E = ", num_experts, " entries, got ",
                counts->size(0));
    check_same_device(*counts, logits, "counts", "logits");
  }
  if (real.has_value()) {
    TORCH_CHECK(counts.has_value(), "real says which rows to count in counts: pass counts with it");
    check_dtype(*real, at::kBool, "real");
    check_shape(*real, 1, "real", "[N]");
    check_contiguous(*real, "real");
    TORCH_CHECK(real->size(0) == logits.size(0), "real must hold N = ", logits.size(0), " entries, got ",
                real->size(0));
    check_same_device(*real, logits, "real", "logits");
  }
}

// expert_combine: out [M, H] float32 or bfloat16 with contiguous rows, slots [N, k] int64 and weights [N, k] float32
// contiguous, group_ends [E] int32, E >= 1.
inline void check_expert_combine_args(const at::Tensor& out, const at::Tensor& slots, const at::Tensor& weights,
                                      const at::Tensor& group_ends) {
  check_float_rows(out, "out", "[M, H] (the experts' rows)");
  check_dtype(slots, at::kLong, "slots");
  check_shape(slots, 2, "slots", "[N, k] (expert_rows' slots)");
  check_contiguous(slots, "slots");
  check_dtype(weights, at::kFloat, "weights");
  check_contiguous(weights, "weights");
  TORCH_CHECK(weights.sizes() == slots.sizes(), "weights must be [N, k] like slots ", slots.sizes(), ", got ",
              weights.sizes());
  check_dtype(group_ends, at::kInt, "group_ends");
  check_shape(group_ends, 1, "group_ends", "[E]");
  TORCH_CHECK(group_ends.size(0) >= 1, "group_ends must hold at least one expert's end");
  check_same_device(slots, out, "slots", "out");
  check_same_device(weights, out, "weights", "out");
  check_same_device(group_ends, out, "group_ends", "out");
}

// A norm's weight: x's dtype (x named x_name) or float32.
inline void check_norm_weight_dtype(const at::Tensor& weight, const at::Tensor& x, const char* x_name) {
  TORCH_CHECK(weight.scalar_type() == x.scalar_type() || weight.scalar_type() == at::kFloat, "weight must be ",
              dtype_name(x.scalar_type()), " (", x_name, "'s dtype) or float32, got ",
              dtype_name(weight.scalar_type()));
}

// rms_norm_rows: x [M, D] float32 or bfloat16 with contiguous rows, weight [D] contiguous in x's dtype or float32.
inline void check_rms_norm_rows_args(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_float_rows(x, "x", "[M, D]");
  check_norm_weight_dtype(weight, x, "x");
  check_shape(weight, 1, "weight", "[D]");
  check_contiguous(weight, "weight");
  check_same_device(weight, x, "weight", "x");
  TORCH_CHECK(weight.size(0) == x.size(1), "weight must hold D = x.size(1) = ", x.size(1), " entries, got ",
              weight.size(0));
  TORCH_CHECK(eps >= 0, "eps must be >= 0, got ", eps);
}

// add_rms_norm: x and delta [M, D] alike in dtype (float32 or bfloat16) and shape, with contiguous rows at any
// stride; weight [D] as rms_norm_rows takes it.
inline void check_add_rms_norm_args(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight,
                                    double eps) {
  check_rms_norm_rows_args(x, weight, eps);
  check_float_rows(delta, "delta", "[M, D] (what the residual stream x gains)");
  check_dtype(delta, x.scalar_type(), "delta (x's dtype)");
  check_same_device(delta, x, "delta", "x");
  TORCH_CHECK(delta.sizes() == x.sizes(), "delta must have x's shape ", x.sizes(), ", got ", delta.sizes());
}

// silu_mul: gate_up [M, 2I] float32 or bfloat16 with contiguous rows at any stride (a fused projection's output).
inline void check_silu_mul_args(const at::Tensor& gate_up) {
  check_float_rows(gate_up, "gate_up", "[M, 2I] (the gate columns, then the up columns)");
  TORCH_CHECK(gate_up.size(1) % 2 == 0, "gate_up must hold an even number of columns (I gate, then I up), got shape ",
              gate_up.sizes());
}

// router_logits: x [N, H] float32 or bfloat16 with contiguous rows at any stride (the normed hidden states), weight
// [E, H] float32 contiguous (the router as the target holds it) on x's device.
inline void check_router_logits_args(const at::Tensor& x, const at::Tensor& weight) {
  check_float_rows(x, "x", "[N, H] (the normed hidden states)");
  check_dtype(weight, at::kFloat, "weight (the router, float32)");
  check_shape(weight, 2, "weight", "[E, H]");
  check_contiguous(weight, "weight");
  check_same_device(weight, x, "weight", "x");
  TORCH_CHECK(weight.size(1) == x.size(1), "weight [E, H] must have x's H = ", x.size(1), " columns, got shape ",
              weight.sizes());
  TORCH_CHECK(weight.size(0) >= 1 && weight.size(1) >= 1, "weight [E, H] needs at least one expert and one column, "
              "got shape ", weight.sizes());
}

// cache_attn: q [N, Hq, D] with contiguous heads (its rows at any stride), keys and values [S, Hkv, D] contiguous,
// float32 or bfloat16 alike, Hq a multiple of Hkv, N >= 1, S >= 1; num_visible a 0-dim int64 on their device (its
// value is checked by the CPU op).
inline void check_cache_attn_args(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                                  const at::Tensor& num_visible, double scale) {
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16,
              "q must be float32 or bfloat16, got ", dtype_name(q.scalar_type()));
  check_shape(q, 3, "q", "[N, Hq, D]");
  check_shape(keys, 3, "keys", "[S, Hkv, D]");
  check_dtype(keys, q.scalar_type(), "keys");
  check_dtype(values, q.scalar_type(), "values");
  TORCH_CHECK(values.sizes() == keys.sizes(), "values must be [S, Hkv, D] like keys ", keys.sizes(), ", got ",
              values.sizes());
  TORCH_CHECK(q.stride(2) == 1 && (q.stride(1) == q.size(2) || q.size(1) == 1), "q's heads must be contiguous "
              "(strides [any, D, 1]), got strides ", q.strides());
  for (const auto& [t, name] : {std::pair{&keys, "keys"}, std::pair{&values, "values"}}) {
    check_contiguous(*t, name);
    check_same_device(*t, q, name, "q");
  }
  check_index_scalar(num_visible, "num_visible");
  check_same_device(num_visible, q, "num_visible", "q");
  TORCH_CHECK(q.size(0) >= 1 && keys.size(0) >= 1, "cache_attn needs N >= 1 query nodes and S >= 1 cache rows, got "
              "q ", q.sizes(), " and keys ", keys.sizes());
  TORCH_CHECK(keys.size(2) == q.size(2), "keys' head dim ", keys.size(2), " must be q's, ", q.size(2));
  TORCH_CHECK(keys.size(1) >= 1 && q.size(1) % keys.size(1) == 0, "q's ", q.size(1),
              " heads must be a multiple of the cache's ", keys.size(1), " key/value heads");
  TORCH_CHECK(scale > 0 && scale < 1e30, "scale must be a positive finite number, got ", scale);
}

constexpr int64_t kMaxHeadNormRopeDim = 512;  // the CUDA kernel holds a head's pairs in a warp's registers

// RoPE angle tables cos and sin [num_rows, half] float32 contiguous (`layout` names the shape), on ref's device.
inline void check_rope_tables(const at::Tensor& cos, const at::Tensor& sin, int64_t num_rows, int64_t half,
                              const char* layout, const at::Tensor& ref, const char* ref_name) {
  for (const auto& [t, name] : {std::pair{&cos, "cos"}, std::pair{&sin, "sin"}}) {
    check_dtype(*t, at::kFloat, name);
    check_shape(*t, 2, name, layout);
    TORCH_CHECK(t->size(0) == num_rows && t->size(1) == half, name, " must be ", layout, " = [", num_rows, ", ", half,
                "], got ", t->sizes());
    check_contiguous(*t, name);
    check_same_device(*t, ref, name, ref_name);
  }
}

// head_norm_rope: x [M, H, D] float32 or bfloat16, each head's D values contiguous (rows and heads at any stride), D
// even and at most kMaxHeadNormRopeDim; weight (optional) [H, D] contiguous in x's dtype or float32; cos and sin
// [M, D/2] float32 contiguous.
inline void check_head_norm_rope_args(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                                      const at::Tensor& cos, const at::Tensor& sin, double eps) {
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "x must be float32 or bfloat16, got ", dtype_name(x.scalar_type()));
  check_shape(x, 3, "x", "[M, H, D]");
  TORCH_CHECK(x.stride(2) == 1 || x.size(2) == 1, "each head of x must be contiguous (x.stride(2) == 1), got strides ",
              x.strides());
  const int64_t dim = x.size(2);
  TORCH_CHECK(dim >= 2 && dim % 2 == 0 && dim <= kMaxHeadNormRopeDim, "the head dim D = x.size(2) must be even and in "
              "[2, ", kMaxHeadNormRopeDim, "], got ", dim);
  if (weight.has_value()) {
    check_norm_weight_dtype(*weight, x, "x");
    check_shape(*weight, 2, "weight", "[H, D] (each head's norm weights)");
    TORCH_CHECK(weight->size(0) == x.size(1) && weight->size(1) == dim, "weight must be [H, D] = [", x.size(1), ", ",
                dim, "], got ", weight->sizes());
    check_contiguous(*weight, "weight");
    check_same_device(*weight, x, "weight", "x");
  }
  check_rope_tables(cos, sin, x.size(0), dim / 2, "[M, D/2]", x, "x");
  TORCH_CHECK(eps >= 0, "eps must be >= 0, got ", eps);
}

// latent_write: kv [N, R + P] float32 or bfloat16 with contiguous rows (at any stride); weight [R] contiguous in kv's
// dtype or float32; cos, sin [N, P/2] float32 contiguous; ckv [S, R] and kpe [S, P] contiguous in kv's dtype, R >= 1,
// P even and at most kMaxHeadNormRopeDim; rows [N] int64 at any stride (its values are checked by the CPU op); all on
// kv's device.
inline void check_latent_write_args(const at::Tensor& kv, const at::Tensor& weight, const at::Tensor& cos,
                                    const at::Tensor& sin, double eps, const at::Tensor& ckv, const at::Tensor& kpe,
                                    const at::Tensor& rows) {
  check_float_rows(kv, "kv", "[N, R + P] (the c_kv | k_pe columns of the projection)");
  check_dtype(ckv, kv.scalar_type(), "ckv (kv's dtype)");
  check_dtype(kpe, kv.scalar_type(), "kpe (kv's dtype)");
  check_shape(ckv, 2, "ckv", "[S, R] (one layer's latent cache)");
  check_shape(kpe, 2, "kpe", "[S, P] (one layer's rope cache)");
  check_contiguous(ckv, "ckv");
  check_contiguous(kpe, "kpe");
  check_same_device(ckv, kv, "ckv", "kv");
  check_same_device(kpe, kv, "kpe", "kv");
  TORCH_CHECK(kpe.size(0) == ckv.size(0), "kpe [S, P] and ckv [S, R] must have the same S, got kpe ", kpe.sizes(),
              " and ckv ", ckv.sizes());
  const int64_t lat_dim = ckv.size(1), rope_dim = kpe.size(1);
  TORCH_CHECK(lat_dim >= 1, "ckv [S, R] needs R >= 1 latent dims, got shape ", ckv.sizes());
  TORCH_CHECK(rope_dim >= 2 && rope_dim % 2 == 0 && rope_dim <= kMaxHeadNormRopeDim, "the rope dim P = kpe.size(1) "
              "must be even and in [2, ", kMaxHeadNormRopeDim, "], got ", rope_dim);
  TORCH_CHECK(kv.size(1) == lat_dim + rope_dim, "kv must hold R + P = ", lat_dim, " + ", rope_dim, " = ",
              lat_dim + rope_dim, " columns (ckv's R, then kpe's P), got shape ", kv.sizes());
  check_norm_weight_dtype(weight, kv, "kv");
  check_shape(weight, 1, "weight", "[R] (the latent norm's weight)");
  TORCH_CHECK(weight.size(0) == lat_dim, "weight must hold R = ckv.size(1) = ", lat_dim, " entries, got ",
              weight.size(0));
  check_contiguous(weight, "weight");
  check_same_device(weight, kv, "weight", "kv");
  check_rope_tables(cos, sin, kv.size(0), rope_dim / 2, "[N, P/2]", kv, "kv");
  check_dtype(rows, at::kLong, "rows");
  check_shape(rows, 1, "rows", "[N] (each row's cache row)");
  TORCH_CHECK(rows.size(0) == kv.size(0), "rows must hold one cache row per row of kv (N = ", kv.size(0), "), got ",
              rows.size(0));
  check_same_device(rows, kv, "rows", "kv");
  TORCH_CHECK(eps >= 0, "eps must be >= 0, got ", eps);
}

// context_write: keys and values [layers, S, Hkv, D] contiguous in kv's dtype, D even and at most
// kMaxHeadNormRopeDim; kv [n, 2 G D] (G = layers Hkv) float32 or bfloat16 with contiguous rows (at any stride); k_norm
// [G, D] contiguous in kv's dtype or float32; rope [2, P, D/2] float32 contiguous; start a 0-dim int64 (its value is
// checked by the CPU op); all on kv's device.
inline void check_context_write_args(const at::Tensor& kv, const at::Tensor& k_norm, const at::Tensor& rope,
                                     const at::Tensor& start, double eps, const at::Tensor& keys,
                                     const at::Tensor& values) {
  check_float_rows(kv, "kv", "[n, 2 G D] (every layer's key heads, then its value heads)");
  for (const auto& [t, name] : {std::pair{&keys, "keys"}, std::pair{&values, "values"}}) {
    check_dtype(*t, kv.scalar_type(), name);
    check_shape(*t, 4, name, "[layers, S, Hkv, D] (the drafter's context cache)");
    check_contiguous(*t, name);
    check_same_device(*t, kv, name, "kv");
  }
  TORCH_CHECK(values.sizes() == keys.sizes(), "values must have keys' shape ", keys.sizes(), ", got ", values.sizes());
  const int64_t dim = keys.size(3), groups = keys.size(0) * keys.size(2);
  TORCH_CHECK(dim >= 2 && dim % 2 == 0 && dim <= kMaxHeadNormRopeDim, "the head dim D = keys.size(3) must be even "
              "and in [2, ", kMaxHeadNormRopeDim, "], got ", dim);
  TORCH_CHECK(kv.size(1) == 2 * groups * dim, "kv must hold 2 G D = 2 x ", groups, " x ", dim, " = ",
              2 * groups * dim, " columns (G = layers x Hkv key heads of D, then as many value heads), got shape ",
              kv.sizes());
  check_norm_weight_dtype(k_norm, kv, "kv");
  check_shape(k_norm, 2, "k_norm", "[G, D] (each layer's k_norm, once per key head)");
  TORCH_CHECK(k_norm.size(0) == groups && k_norm.size(1) == dim, "k_norm must be [G, D] = [", groups, ", ", dim,
              "], got ", k_norm.sizes());
  check_contiguous(k_norm, "k_norm");
  check_same_device(k_norm, kv, "k_norm", "kv");
  check_dtype(rope, at::kFloat, "rope");
  check_shape(rope, 3, "rope", "[2, P, D/2] (cos, then sin, of positions 0 .. P - 1)");
  TORCH_CHECK(rope.size(0) == 2 && rope.size(2) == dim / 2, "rope must be [2, P, D/2] with D/2 = ", dim / 2,
              ", got ", rope.sizes());
  check_contiguous(rope, "rope");
  check_same_device(rope, kv, "rope", "kv");
  check_index_scalar(start, "start");
  check_same_device(start, kv, "start", "kv");
  TORCH_CHECK(eps >= 0, "eps must be >= 0, got ", eps);
}

}  // namespace ddtree
