// The ddtree op library: each op's schema, written once, and its CPU implementation.
// CUDA implementations register themselves in cuda/binding.cpp (TORCH_LIBRARY_IMPL(ddtree, CUDA, m)).
// Contracts: kernels/ops.py.
#include <torch/library.h>

#include "cpu/cpu_ops.h"

TORCH_LIBRARY(ddtree, m) {
  m.set_python_module("kernels.ops");
  m.def(
      "tree_build(Tensor draft_logprobs, Tensor root_token, int budget, Tensor? budget_limit=None) -> (Tensor tokens, "
      "Tensor parents, "
      "Tensor depths, Tensor ranks, Tensor scores, Tensor visibility)");
  m.def(
      "verify_attn(Tensor q_lat, Tensor q_pe, Tensor ckv, Tensor kpe, Tensor prefix_len, Tensor block_mask, "
      "float scale, bool batch_invariant=False) -> (Tensor o_lat, Tensor lse)");
  m.def(
      "tree_accept(Tensor tokens, Tensor parents, Tensor target, int max_depth) -> (Tensor path, Tensor path_len, "
      "Tensor bonus)");
  m.def("kv_compact(Tensor(a!) ckv, Tensor(b!) kpe, Tensor prefix_len, Tensor path) -> ()");
  // A step's commit: the accepted path's target tokens appended to the generated tokens, the counters moved.
  m.def(
      "commit_path(Tensor target, Tensor path, Tensor path_len, Tensor bonus, Tensor(a!) generated, "
      "Tensor(b!) num_generated, Tensor(c!) root, Tensor(d!) prefix_len) -> ()");
  // The budget policy's bookkeeping of a drafted step (`--budget auto`): the choice and the confidence update.
  m.def(
      "budget_choose(Tensor scores, Tensor parents, Tensor depths, Tensor ranks, Tensor realised, Tensor predicted, "
      "Tensor buckets, Tensor seconds) -> (Tensor chosen, Tensor expected, Tensor value)");
  m.def(
      "confidence_learn(Tensor(a!) realised, Tensor(b!) predicted, Tensor parents, Tensor depths, Tensor ranks, "
      "Tensor scores, Tensor path) -> ()");
  // The batch-invariant mode's matmul, every row's reductions in an order fixed by the row alone.
  m.def("linear_rows(Tensor x, Tensor packed, int out_features, Tensor? group_ends=None) -> Tensor");
  m.def("rms_norm_rows(Tensor x, Tensor weight, float eps) -> Tensor");
  // The residual add with the RMSNorm that follows it, and SwiGLU's silu(gate) * up: one launch each.
  m.def("add_rms_norm(Tensor x, Tensor delta, Tensor weight, float eps) -> (Tensor sum, Tensor y)");
  m.def("silu_mul(Tensor gate_up) -> Tensor");
  // The MoE router's float32 logits, each one reduced in an order fixed by H alone (router_order.h).
  m.def("router_logits(Tensor x, Tensor weight) -> Tensor");
  // DeepSeek-V3 routing, each row alone: the top-k experts and their weights (and the count of each expert's rows).
  m.def(
      "moe_route(Tensor logits, Tensor bias, int top_k, int num_groups, int top_groups, bool softmax, bool normalize, "
      "float scaling, Tensor(a!)? counts=None, Tensor? real=None) -> (Tensor idx, Tensor weights)");
  // The routed experts' rows: grouped by expert for the grouped matmuls, and each token's k outputs summed back.
  m.def("expert_rows(Tensor x, Tensor idx, int num_experts) -> (Tensor rows, Tensor slots, Tensor group_ends)");
  m.def("expert_combine(Tensor out, Tensor slots, Tensor weights, Tensor group_ends) -> Tensor");
  // The DFlash drafter's attention: grouped-query attention of a few rows over a cache's first num_visible rows.
  m.def("cache_attn(Tensor q, Tensor keys, Tensor values, Tensor num_visible, float scale) -> Tensor");
  m.def("head_norm_rope(Tensor x, Tensor? weight, Tensor cos, Tensor sin, float eps, bool interleave=False) -> Tensor");
  // An absorbed-MLA layer's latent cache write: each row's c_kv normed into ckv and its k_pe turned into kpe.
  m.def(
      "latent_write(Tensor kv, Tensor weight, Tensor cos, Tensor sin, float eps, bool interleave, Tensor(a!) ckv, "
      "Tensor(b!) kpe, Tensor rows) -> ()");
  // The DFlash drafter's context cache write: every layer's keys normed and turned, and its values, at start + i.
  m.def(
      "context_write(Tensor kv, Tensor k_norm, Tensor rope, Tensor start, float eps, Tensor(a!) keys, "
      "Tensor(b!) values) -> ()");
  // Capture helpers, CUDA only (kernels/graph_switch.py): a switch node inside a CUDA graph picked by `index`.
  m.def("graph_switch_begin(Tensor index, int num_branches, int pool_first, int pool_second) -> int");
  m.def("graph_branch_begin(Tensor index, int switch_id, int branch) -> ()");
  m.def("graph_branch_end(Tensor index, int switch_id) -> ()");
  m.def("graph_switch_end(Tensor index, int switch_id) -> ()");
  // CUDA only (kernels/graph_upload.py): a captured graph's executable uploaded to its device on the current stream.
  m.def("graph_upload(int graph_exec) -> ()");
}

TORCH_LIBRARY_IMPL(ddtree, CPU, m) {
  m.impl("tree_build", &ddtree::cpu::tree_build);
  m.impl("verify_attn", &ddtree::cpu::verify_attn);
  m.impl("tree_accept", &ddtree::cpu::tree_accept);
  m.impl("kv_compact", &ddtree::cpu::kv_compact);
  m.impl("commit_path", &ddtree::cpu::commit_path);
  m.impl("budget_choose", &ddtree::cpu::budget_choose);
  m.impl("confidence_learn", &ddtree::cpu::confidence_learn);
  m.impl("linear_rows", &ddtree::cpu::linear_rows);
  m.impl("rms_norm_rows", &ddtree::cpu::rms_norm_rows);
  m.impl("add_rms_norm", &ddtree::cpu::add_rms_norm);
  m.impl("silu_mul", &ddtree::cpu::silu_mul);
  m.impl("router_logits", &ddtree::cpu::router_logits);
  m.impl("moe_route", &ddtree::cpu::moe_route);
  m.impl("expert_rows", &ddtree::cpu::expert_rows);
  m.impl("expert_combine", &ddtree::cpu::expert_combine);
  m.impl("cache_attn", &ddtree::cpu::cache_attn);
  m.impl("head_norm_rope", &ddtree::cpu::head_norm_rope);
  m.impl("latent_write", &ddtree::cpu::latent_write);
  m.impl("context_write", &ddtree::cpu::context_write);
}
