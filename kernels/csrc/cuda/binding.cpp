// CUDA implementations of the ddtree ops (schemas: ../ops.cpp; contracts: kernels/ops.py).
//
// The one file here that includes torch: it checks the arguments (metadata only, never values, so no host
// sync), guards the device, takes the current stream, allocates outputs and workspaces through the
// caching allocator, dispatches float32 / bfloat16 and turns a failed launch into an error naming the op.
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/library.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "../cache_attn_torch.h"
#include "../checks.h"
#include "../tree_outputs.h"
#include "add_rms_norm.cuh"
#include "budget_choose.cuh"
#include "cache_attn.cuh"
#include "commit_path.cuh"
#include "confidence_learn.cuh"
#include "context_write.cuh"
#include "expert_rows.cuh"
#include "graph_switch.cuh"
#include "head_norm_rope.cuh"
#include "kv_compact.cuh"
#include "latent_write.cuh"
#include "linear_rows.cuh"
#include "moe_route.cuh"
#include "rms_norm_rows.cuh"
#include "router_logits.cuh"
#include "silu_mul.cuh"
#include "tree_accept.cuh"
#include "tree_build.cuh"
#include "verify_attn.cuh"
#include "verify_attn_exact.cuh"
#include "verify_attn_exact_wgmma.cuh"

namespace ddtree::cuda {
namespace {

void check_on_cuda(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(t.is_cuda(), op, " (CUDA): ", name, " must be a CUDA tensor, got one on ", t.device(),
              "; move all arguments of the op to one GPU");
}

void check_launch(cudaError_t err, const char* op) {
  TORCH_CHECK(err == cudaSuccess, op, " (CUDA): kernel launch failed: ", cudaGetErrorName(err), " (",
              cudaGetErrorString(err), ")");
}

// An implementation picked by an environment variable (the first choice when unset), to compare them.
template <typename T>
struct Choice {
  const char* name;
  T value;
};

template <typename T, size_t N>
const Choice<T>& env_choice(const char* op, const char* var, const Choice<T> (&choices)[N]) {
  const char* env = std::getenv(var);
  const std::string value = env == nullptr ? choices[0].name : env;
  std::string names;
  for (const Choice<T>& choice : choices) {
    if (value == choice.name) return choice;
    names += (names.empty() ? "" : ", ") + std::string(choice.name);
  }
  TORCH_CHECK(false, op, " (CUDA): ", var, "=", value, " is not one of ", names, ": pick one or unset it");
}

constexpr Choice<VerifyAttnKernel> kVerifyAttnKernels[] = {{"auto", VerifyAttnKernel::kAuto},
                                                           {"wgmma", VerifyAttnKernel::kWgmma},
                                                           {"mma", VerifyAttnKernel::kMmaSync},
                                                           {"cuda-core", VerifyAttnKernel::kCudaCore}};

constexpr Choice<LinearRowsKernel> kLinearRowsKernels[] = {
    {"auto", LinearRowsKernel::kAuto}, {"wgmma", LinearRowsKernel::kWgmma}, {"mma", LinearRowsKernel::kMmaSync}};

// A count from an environment variable, 0 when unset or "auto" (the kernel's choice).
int env_count(const char* op, const char* var, int max_value) {
  const char* env = std::getenv(var);
  if (env == nullptr || std::string(env) == "auto") return 0;
  char* end = nullptr;
  const long value = std::strtol(env, &end, 10);
  TORCH_CHECK(*env != '\0' && *end == '\0' && value >= 1 && value <= max_value, op, " (CUDA): ", var, "=", env,
              " is not a count from 1 to ", max_value, " or auto: pick one or unset it");
  return static_cast<int>(value);
}

// How the batch-invariant tensor-core kernel spreads its splits over blocks (the same bits either way).
constexpr Choice<int> kExactBlocks[] = {{"auto", 0}, {"split", 1}, {"group", 2}};

constexpr Choice<TreeBuildMethod> kTreeBuildMethods[] = {{"auto", TreeBuildMethod::kAuto},
                                                          {"heap", TreeBuildMethod::kHeap},
                                                          {"threshold", TreeBuildMethod::kThreshold}};

int as_int(int64_t value, const char* op, const char* what) {
  TORCH_CHECK(value <= std::numeric_limits<int>::max(), op, " (CUDA): ", what, " = ", value,
              " is too large for the kernel (at most ", std::numeric_limits<int>::max(), ")");
  return static_cast<int>(value);
}

at::Tensor workspace(const at::Tensor& like, size_t bytes) {
  return at::empty({static_cast<int64_t>(bytes)}, like.options().dtype(at::kByte));
}

TreeBuildOutputs tree_build(const at::Tensor& draft_logprobs, const at::Tensor& root_token, int64_t budget,
                            const std::optional<at::Tensor>& budget_limit) {
  constexpr const char* op = "tree_build";
  check_tree_build_args(draft_logprobs, root_token, budget);
  check_budget_limit(budget_limit, draft_logprobs);
  check_on_cuda(draft_logprobs, op, "draft_logprobs");
  const int num_depths = as_int(draft_logprobs.size(0), op, "L (draft_logprobs.size(0))");
  const int64_t vocab = draft_logprobs.size(1);
  TORCH_CHECK(std::min<int64_t>(num_depths, budget) <= kTreeBuildMaxDepth, op,
              " (CUDA): a tree of budget ", budget, " over L = ", num_depths, " draft positions reaches depth ",
              std::min<int64_t>(num_depths, budget), "; the kernel handles at most ", kTreeBuildMaxDepth,
              ": draft fewer positions or use the CPU op");
  TORCH_CHECK(vocab <= TreeBuildMaxVocab(static_cast<int>(budget)), op, " (CUDA): vocabulary V = ", vocab,
              " is above the kernel's limit of ", TreeBuildMaxVocab(static_cast<int>(budget)), " at budget ", budget,
              ": lower the budget or use the CPU op");

  const c10::cuda::CUDAGuard guard(draft_logprobs.device());
  TreeBuildOutputs outputs = empty_tree_build_outputs(draft_logprobs, budget);  // the kernel writes every element
  auto& [tokens, parents, depths, ranks, scores, visibility] = outputs;
  at::Tensor ws = workspace(draft_logprobs, TreeBuildWorkspaceBytes(num_depths, static_cast<int>(vocab),
                                                                    static_cast<int>(budget)));
  TreeBuildArgs args{};
  args.draft_logprobs = draft_logprobs.const_data_ptr<float>();
  args.root_token = root_token.const_data_ptr<int64_t>();
  args.num_depths = num_depths;
  args.vocab = static_cast<int>(vocab);
  args.budget = static_cast<int>(budget);
  args.budget_limit = budget_limit.has_value() ? budget_limit->const_data_ptr<int64_t>() : nullptr;
  args.workspace = ws.mutable_data_ptr();
  args.tokens = tokens.mutable_data_ptr<int64_t>();
  args.parents = parents.mutable_data_ptr<int64_t>();
  args.depths = depths.mutable_data_ptr<int64_t>();
  args.ranks = ranks.mutable_data_ptr<int64_t>();
  args.scores = scores.mutable_data_ptr<float>();
  args.visibility = visibility.mutable_data_ptr<bool>();
  args.method = env_choice(op, "DDTREE_TREE_BUILD", kTreeBuildMethods).value;
  check_launch(TreeBuild(args, c10::cuda::getCurrentCUDAStream()), op);
  return outputs;
}

// The inputs and outputs both verify_attn kernels' argument structs share (VerifyAttnArgs, VerifyAttnExactArgs).
template <typename T, typename Args>
void fill_attn_args(Args& args, const at::Tensor& q_lat, const at::Tensor& q_pe, const at::Tensor& ckv,
                    const at::Tensor& kpe, const at::Tensor& prefix_len, const at::Tensor& block_mask, double scale,
                    at::Tensor& o_lat, at::Tensor& lse) {
  args.q_lat = static_cast<const T*>(q_lat.const_data_ptr());
  args.q_pe = static_cast<const T*>(q_pe.const_data_ptr());
  args.ckv = static_cast<const T*>(ckv.const_data_ptr());
  args.kpe = static_cast<const T*>(kpe.const_data_ptr());
  args.prefix_len = prefix_len.const_data_ptr<int64_t>();
  args.block_mask = block_mask.const_data_ptr<bool>();
  args.num_nodes = static_cast<int>(q_lat.size(0));
  args.num_heads = static_cast<int>(q_lat.size(1));
  args.lat_dim = static_cast<int>(q_lat.size(2));
  args.rope_dim = static_cast<int>(q_pe.size(2));
  args.cache_rows = static_cast<int>(ckv.size(0));
  args.scale = static_cast<float>(scale);
  args.o_lat = static_cast<T*>(o_lat.mutable_data_ptr());
  args.lse = lse.mutable_data_ptr<float>();
}

template <typename T>
cudaError_t launch_verify_attn(const at::Tensor& q_lat, const at::Tensor& q_pe, const at::Tensor& ckv,
                               const at::Tensor& kpe, const at::Tensor& prefix_len, const at::Tensor& block_mask,
                               double scale, at::Tensor& o_lat, at::Tensor& lse) {
  VerifyAttnArgs<T> args{};
  fill_attn_args<T>(args, q_lat, q_pe, ckv, kpe, prefix_len, block_mask, scale, o_lat, lse);
  const Choice<VerifyAttnKernel>& wanted =
      env_choice("verify_attn", "DDTREE_VERIFY_ATTN_KERNEL", kVerifyAttnKernels);
  args.kernel = VerifyAttnResolveKernel(args, wanted.value);
  TORCH_CHECK(args.kernel != VerifyAttnKernel::kAuto, "verify_attn (CUDA): DDTREE_VERIFY_ATTN_KERNEL=", wanted.name,
              " cannot run these inputs (", q_lat.scalar_type(), ", R = ", args.lat_dim, ", P = ", args.rope_dim,
              "): wgmma needs an sm_90a build on a compute capability 9.0 GPU and mma one of 8.0 or newer, both "
              "bfloat16 with R = 512, P = 64 and 16-byte aligned inputs; unset it or pick cuda-core");
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&args.num_sms, cudaDevAttrMultiProcessorCount, q_lat.get_device()));
  args.num_splits = VerifyAttnNumSplits(args.kernel, args.num_nodes, args.num_heads, args.cache_rows, args.num_sms,
                                        env_count("verify_attn", "DDTREE_VERIFY_ATTN_SPLITS", kVerifyAttnMaxSplits));
  const at::Tensor ws =
      workspace(q_lat, VerifyAttnWorkspaceBytes(args.num_nodes, args.num_heads, args.lat_dim, args.num_splits));
  args.workspace = args.num_splits > 1 ? static_cast<float*>(ws.mutable_data_ptr()) : nullptr;
  return VerifyAttn<T>(args, c10::cuda::getCurrentCUDAStream());
}

template <typename T>
cudaError_t launch_verify_attn_exact(const at::Tensor& q_lat, const at::Tensor& q_pe, const at::Tensor& ckv,
                                     const at::Tensor& kpe, const at::Tensor& prefix_len,
                                     const at::Tensor& block_mask, double scale, at::Tensor& o_lat, at::Tensor& lse) {
  VerifyAttnExactArgs<T> args{};
  fill_attn_args<T>(args, q_lat, q_pe, ckv, kpe, prefix_len, block_mask, scale, o_lat, lse);
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    // The tensor-core kernel wherever it runs: a choice made on dtype, widths and device alone, never on N, so
    // that AR (N = 1) and a tree call reduce every row in the same order.
    if (exact_sm90::supported(args)) {
      int num_sms = 0;
      C10_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, q_lat.get_device()));
      const int target = env_count("verify_attn", "DDTREE_VERIFY_ATTN_EXACT_SPLITS", exact_sm90::kMaxSplitTarget);
      args.split_target = target == 0 ? exact_sm90::kDefaultSplitTarget : target;
      const int blocks = env_choice("verify_attn", "DDTREE_VERIFY_ATTN_EXACT_BLOCKS", kExactBlocks).value;
      args.group_per_block = blocks == 0 ? exact_sm90::group_per_block(args.num_nodes, args.num_heads,
                                                                        args.cache_rows, args.split_target, num_sms)
                                         : blocks == 2 && args.num_heads % 64 == 0;  // else a block per split
      args.chunk_nodes = exact_sm90::chunk_nodes(args.num_nodes, args.num_heads, args.cache_rows, args.split_target,
                                                 args.group_per_block);
      const at::Tensor ws = workspace(q_lat, exact_sm90::workspace_bytes(args.chunk_nodes, args.num_heads,
                                                                         args.cache_rows, args.split_target,
                                                                         args.group_per_block));
      args.workspace = static_cast<float*>(ws.mutable_data_ptr());
      return exact_sm90::launch(args, c10::cuda::getCurrentCUDAStream());
    }
  }
  return VerifyAttnExact<T>(args, c10::cuda::getCurrentCUDAStream());
}

std::tuple<at::Tensor, at::Tensor> verify_attn(const at::Tensor& q_lat, const at::Tensor& q_pe, const at::Tensor& ckv,
                                               const at::Tensor& kpe, const at::Tensor& prefix_len,
                                               const at::Tensor& block_mask, double scale, bool batch_invariant) {
  constexpr const char* op = "verify_attn";
  check_verify_attn_args(q_lat, q_pe, ckv, kpe, prefix_len, block_mask);
  check_on_cuda(q_lat, op, "q_lat");
  TORCH_CHECK(q_lat.size(2) >= 1 && q_lat.size(2) <= kVerifyAttnMaxLatDim, op, " (CUDA): R = q_lat.size(2) = ",
              q_lat.size(2), " must be in [1, ", kVerifyAttnMaxLatDim, "] (kv_lora_rank)");
  TORCH_CHECK(q_pe.size(2) <= kVerifyAttnMaxRopeDim, op, " (CUDA): P = q_pe.size(2) = ", q_pe.size(2),
              " must be at most ", kVerifyAttnMaxRopeDim, " (qk_rope_head_dim)");
  TORCH_CHECK(q_lat.size(0) <= kVerifyAttnMaxNodes, op, " (CUDA): N = q_lat.size(0) = ", q_lat.size(0),
              " must be at most ", kVerifyAttnMaxNodes, " nodes per call");
  as_int(q_lat.size(1), op, "H (q_lat.size(1))");
  as_int(ckv.size(0), op, "S (ckv.size(0))");

  const c10::cuda::CUDAGuard guard(q_lat.device());
  at::Tensor o_lat = at::empty_like(q_lat);
  at::Tensor lse = at::empty({q_lat.size(0), q_lat.size(1)}, q_lat.options().dtype(at::kFloat));
  const bool fp32 = q_lat.scalar_type() == at::kFloat;
  const cudaError_t err =
      batch_invariant
          ? (fp32 ? launch_verify_attn_exact<float>(q_lat, q_pe, ckv, kpe, prefix_len, block_mask, scale, o_lat, lse)
                  : launch_verify_attn_exact<__nv_bfloat16>(q_lat, q_pe, ckv, kpe, prefix_len, block_mask, scale,
                                                            o_lat, lse))
          : (fp32 ? launch_verify_attn<float>(q_lat, q_pe, ckv, kpe, prefix_len, block_mask, scale, o_lat, lse)
                  : launch_verify_attn<__nv_bfloat16>(q_lat, q_pe, ckv, kpe, prefix_len, block_mask, scale, o_lat,
                                                      lse));
  check_launch(err, op);
  return {o_lat, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> tree_accept(const at::Tensor& tokens, const at::Tensor& parents,
                                                           const at::Tensor& target, int64_t max_depth) {
  constexpr const char* op = "tree_accept";
  check_tree_accept_args(tokens, parents, target, max_depth);
  check_on_cuda(tokens, op, "tokens");
  TORCH_CHECK(tokens.size(0) <= kTreeAcceptMaxNodes, op, " (CUDA): N = ", tokens.size(0), " nodes is above the ",
              "kernel's limit of ", kTreeAcceptMaxNodes);
  const int path_size = as_int(max_depth + 1, op, "max_depth + 1");

  const c10::cuda::CUDAGuard guard(tokens.device());
  at::Tensor path = at::empty({path_size}, tokens.options());
  at::Tensor path_len = at::empty({}, tokens.options());
  at::Tensor bonus = at::empty({}, tokens.options());
  TreeAcceptArgs args{};
  args.tokens = tokens.const_data_ptr<int64_t>();
  args.parents = parents.const_data_ptr<int64_t>();
  args.target = target.const_data_ptr<int64_t>();
  args.num_nodes = static_cast<int>(tokens.size(0));
  args.max_depth = path_size - 1;
  args.path = path.mutable_data_ptr<int64_t>();
  args.path_len = path_len.mutable_data_ptr<int64_t>();
  args.bonus = bonus.mutable_data_ptr<int64_t>();
  check_launch(TreeAccept(args, c10::cuda::getCurrentCUDAStream()), op);
  return {path, path_len, bonus};
}

void kv_compact(const at::Tensor& ckv, const at::Tensor& kpe, const at::Tensor& prefix_len, const at::Tensor& path) {
  constexpr const char* op = "kv_compact";
  check_kv_compact_args(ckv, kpe, prefix_len, path);
  check_on_cuda(ckv, op, "ckv");
  TORCH_CHECK(ckv.size(0) <= 65535, op, " (CUDA): num_layers = ckv.size(0) = ", ckv.size(0),
              " is above the kernel's limit of 65535");

  const c10::cuda::CUDAGuard guard(ckv.device());
  KvCompactArgs args{};
  args.ckv = ckv.mutable_data_ptr();
  args.kpe = kpe.mutable_data_ptr();
  args.num_layers = static_cast<int>(ckv.size(0));
  args.cache_rows = as_int(ckv.size(1), op, "S (ckv.size(1))");
  args.ckv_row_bytes = as_int(ckv.size(2) * static_cast<int64_t>(ckv.element_size()), op, "ckv row bytes");
  args.kpe_row_bytes = as_int(kpe.size(2) * static_cast<int64_t>(kpe.element_size()), op, "kpe row bytes");
  args.prefix_len = prefix_len.const_data_ptr<int64_t>();
  args.path = path.const_data_ptr<int64_t>();
  args.path_size = as_int(path.size(0), op, "path.size(0)");
  check_launch(KvCompact(args, c10::cuda::getCurrentCUDAStream()), op);
}

void commit_path(const at::Tensor& target, const at::Tensor& path, const at::Tensor& path_len, const at::Tensor& bonus,
                 const at::Tensor& generated, const at::Tensor& num_generated, const at::Tensor& root,
                 const at::Tensor& prefix_len) {
  constexpr const char* op = "commit_path";
  check_commit_path_args(target, path, path_len, bonus, generated, num_generated, root, prefix_len);
  check_on_cuda(target, op, "target");

  const c10::cuda::CUDAGuard guard(target.device());
  CommitPathArgs args{};
  args.target = target.const_data_ptr<int64_t>();
  args.target_stride = target.stride(0);
  args.num_nodes = target.size(0);
  args.path = path.const_data_ptr<int64_t>();
  args.path_stride = path.stride(0);
  args.path_size = path.size(0);
  args.path_len = path_len.const_data_ptr<int64_t>();
  args.bonus = bonus.const_data_ptr<int64_t>();
  args.generated = generated.mutable_data_ptr<int64_t>();
  args.num_slots = generated.size(0);
  args.num_generated = num_generated.mutable_data_ptr<int64_t>();
  args.root = root.mutable_data_ptr<int64_t>();
  args.prefix_len = prefix_len.mutable_data_ptr<int64_t>();
  check_launch(CommitPath(args, c10::cuda::getCurrentCUDAStream()), op);
}

// The tree and tables of the budget ops, checked for the kernels: one block holds the tree, the cells index an int.
BudgetTree budget_tree(const at::Tensor& scores, const at::Tensor& parents, const at::Tensor& depths,
                       const at::Tensor& ranks, const at::Tensor& realised, const char* op) {
  check_on_cuda(scores, op, "scores");
  TORCH_CHECK(scores.size(0) <= kBudgetMaxNodes, op, " (CUDA): N = ", scores.size(0), " nodes is above the kernel's ",
              "limit of ", kBudgetMaxNodes, " (a tree of budget 1024): use the CPU op");
  as_int(realised.numel(), op, "the confidence tables' size (realised.numel())");
  BudgetTree tree{};
  tree.scores = scores.const_data_ptr<float>();
  tree.parents = parents.const_data_ptr<int64_t>();
  tree.depths = depths.const_data_ptr<int64_t>();
  tree.ranks = ranks.const_data_ptr<int64_t>();
  tree.num_nodes = static_cast<int>(scores.size(0));
  tree.num_depths = static_cast<int>(realised.size(0));
  tree.num_classes = static_cast<int>(realised.size(1));
  return tree;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> budget_choose(const at::Tensor& scores, const at::Tensor& parents,
                                                             const at::Tensor& depths, const at::Tensor& ranks,
                                                             const at::Tensor& realised, const at::Tensor& predicted,
                                                             const at::Tensor& buckets, const at::Tensor& seconds) {
  constexpr const char* op = "budget_choose";
  check_budget_choose_args(scores, parents, depths, ranks, realised, predicted, buckets, seconds);
  BudgetChooseArgs args{};
  args.tree = budget_tree(scores, parents, depths, ranks, realised, op);
  const c10::cuda::CUDAGuard guard(scores.device());
  at::Tensor chosen = at::empty({}, buckets.options());
  at::Tensor expected = at::empty_like(seconds);
  at::Tensor value = at::empty_like(seconds);
  args.realised = realised.const_data_ptr<float>();
  args.predicted = predicted.const_data_ptr<float>();
  args.buckets = buckets.const_data_ptr<int64_t>();
  args.seconds = seconds.const_data_ptr<float>();
  args.num_buckets = as_int(buckets.size(0), op, "K (buckets.size(0))");
  args.chosen = chosen.mutable_data_ptr<int64_t>();
  args.expected = expected.mutable_data_ptr<float>();
  args.value = value.mutable_data_ptr<float>();
  check_launch(BudgetChoose(args, c10::cuda::getCurrentCUDAStream()), op);
  return {chosen, expected, value};
}

void confidence_learn(const at::Tensor& realised, const at::Tensor& predicted, const at::Tensor& parents,
                      const at::Tensor& depths, const at::Tensor& ranks, const at::Tensor& scores,
                      const at::Tensor& path) {
  constexpr const char* op = "confidence_learn";
  check_confidence_learn_args(realised, predicted, parents, depths, ranks, scores, path);
  ConfidenceLearnArgs args{};
  args.tree = budget_tree(scores, parents, depths, ranks, realised, op);
  const c10::cuda::CUDAGuard guard(scores.device());
  args.realised = realised.mutable_data_ptr<float>();
  args.predicted = predicted.mutable_data_ptr<float>();
  args.path = path.const_data_ptr<int64_t>();
  args.path_size = as_int(path.size(0), op, "M (path.size(0))");
  check_launch(ConfidenceLearn(args, c10::cuda::getCurrentCUDAStream()), op);
}

at::Tensor linear_rows(const at::Tensor& x_in, const at::Tensor& packed, int64_t out_features,
                       const std::optional<at::Tensor>& group_ends) {
  constexpr const char* op = "linear_rows";
  check_linear_rows_common(x_in, packed, out_features, group_ends);
  check_on_cuda(x_in, op, "x");
  const bool bf16 = x_in.scalar_type() == at::kBFloat16;
  TORCH_CHECK(bf16 || x_in.scalar_type() == at::kFloat, op, " (CUDA): x must be bfloat16 or float32, got ",
              dtype_name(x_in.scalar_type()));
  check_dtype(packed, x_in.scalar_type(), "packed");
  const int64_t depth = x_in.size(2), padded_depth = bf16 ? (depth + 7) / 8 * 8 : depth;
  const bool grouped = group_ends.has_value();
  const int64_t num_groups = packed.dim() == 3 ? packed.size(0) : 0;
  TORCH_CHECK(packed.dim() == 3 && packed.size(1) == out_features && packed.size(2) == padded_depth &&
                  (grouped || num_groups == x_in.size(1)),
              op, " (CUDA): packed must be [G, N, K'] for G = ", grouped ? num_groups : x_in.size(1),
              ", N = out_features = ", out_features, " and K' = ", padded_depth, " (K = x.size(2) = ", depth,
              bf16 ? " rounded up to 8" : "", "; pack the [G, N, K] weights with kernels.ops.pack_linear_rows), got ",
              packed.sizes());
  TORCH_CHECK(num_groups <= 65535, op, " (CUDA): G = ", num_groups, " groups is above the kernel's limit of 65535");

  const c10::cuda::CUDAGuard guard(x_in.device());
  int major = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, x_in.get_device()));
  TORCH_CHECK(!bf16 || major >= 8, op, " (CUDA): the bfloat16 kernel needs tensor cores of sm_80 or later, this ",
              "GPU is sm_", major, "x; pass float32 rows and weights (the batch-invariant mode falls back to fixed ",
              "row blocks)");
  // The tensor cores read K in 16-byte pieces: rows whose K, strides or start are not 16-byte aligned are copied
  // once, zero-padded to K' (zeros add nothing to a row's chain).
  at::Tensor x = x_in;
  const auto aligned = [&](int64_t elements) { return elements % 8 == 0; };
  if (bf16 && (!aligned(depth) || !aligned(x.stride(0)) || !aligned(x.stride(1)) ||
               reinterpret_cast<uintptr_t>(x.const_data_ptr()) % 16 != 0)) {
    x = at::zeros({x_in.size(0), x_in.size(1), padded_depth}, x_in.options());
    x.narrow(2, 0, depth).copy_(x_in);
  }
  const int64_t out_groups = x.size(1);
  at::Tensor out = grouped ? at::zeros({x.size(0), out_groups, out_features}, x.options())
                           : at::empty({x.size(0), out_groups, out_features}, x.options());
  LinearRowsArgs args{};
  args.x = x.const_data_ptr();
  args.weight = packed.const_data_ptr();
  args.group_ends = grouped ? group_ends->const_data_ptr<int32_t>() : nullptr;
  args.out = out.mutable_data_ptr();
  args.row_stride = x.stride(0);
  args.group_stride = grouped ? 0 : x.stride(1);
  args.num_rows = as_int(x.size(0), op, "M (x.size(0))");
  args.num_groups = grouped ? static_cast<int>(num_groups) : static_cast<int>(out_groups);
  args.out_groups = static_cast<int>(out_groups);
  args.depth = as_int(padded_depth, op, "K");
  args.num_cols = as_int(out_features, op, "N (out_features)");
  args.bf16 = bf16;
  args.kernel = env_choice(op, "DDTREE_LINEAR_ROWS_KERNEL", kLinearRowsKernels).value;
  TORCH_CHECK(args.kernel != LinearRowsKernel::kWgmma || LinearRowsWgmmaAvailable(), op,
              " (CUDA): DDTREE_LINEAR_ROWS_KERNEL=wgmma needs an sm_90a build on a compute capability 9.0 GPU; ",
              "unset it");
  int num_sms = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, x.get_device()));
  args.plan = LinearRowsPlanFor(args.num_cols, args.depth, args.num_groups, grouped, bf16, num_sms);
  at::Tensor partial;
  if (const size_t elements = LinearRowsPartialElements(args); elements > 0) {
    partial = at::empty({static_cast<int64_t>(elements)}, x.options().dtype(at::kFloat));
    args.partial = partial.mutable_data_ptr<float>();
  }
  check_launch(LinearRows(args, c10::cuda::getCurrentCUDAStream()), op);
  return out;
}

// -- graph switches: capture helpers for kernels/graph_switch.py (design: graph_switch.cuh) --------------------
//
// A switch node's branches are captured one after the other on a side stream, each into its body graph
// (cudaStreamBeginCaptureToGraph). While a branch is captured, the caching allocator serves that capture from the
// parent graph's pool, as it serves the parent capture before and after: the tensors a branch allocates live as
// long as the graph does.

struct GraphSwitch {
  std::vector<cudaGraph_t> branches;
  unsigned long long parent_capture;  // the capture the switch node is in
  c10::cuda::MempoolId_t pool;        // the parent graph's pool
  c10::DeviceIndex device;
};

std::mutex graph_switches_mutex;
std::unordered_map<int64_t, GraphSwitch> graph_switches;
int64_t next_graph_switch = 0;

struct CaptureInfo {
  cudaStreamCaptureStatus status{};
  unsigned long long id = 0;
  cudaGraph_t graph = nullptr;
  const cudaGraphNode_t* dependencies = nullptr;
  const cudaGraphEdgeData* edges = nullptr;
  size_t num_dependencies = 0;
};

CaptureInfo capture_info(cudaStream_t stream) {
  CaptureInfo info;
  C10_CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &info.status, &info.id, &info.graph, &info.dependencies,
                                          &info.edges, &info.num_dependencies));
  return info;
}

// Routes the pool's allocations to the capture `capture_id` (and no other), keeping the pool's use count as it was
// (beginAllocateToPool counts one more use of the pool; the parent capture already holds one).
void allocate_to_capture(const GraphSwitch& sw, unsigned long long capture_id) {
  namespace alloc = c10::cuda::CUDACachingAllocator;
  alloc::endAllocateToPool(sw.device, sw.pool);
  alloc::beginAllocateToPool(sw.device, sw.pool, [capture_id](cudaStream_t stream) {
    cudaStreamCaptureStatus status{};
    unsigned long long id = 0;
    C10_CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &status, &id));
    return status == cudaStreamCaptureStatusActive && id == capture_id;
  });
  alloc::releasePool(sw.device, sw.pool);
}

void check_switch_index(const at::Tensor& index, const char* op) {
  check_on_cuda(index, op, "index");
  TORCH_CHECK(index.dim() == 0 && index.scalar_type() == at::kLong, op, ": index must be a 0-dim int64 tensor, got ",
              index.sizes(), " ", index.scalar_type());
}

GraphSwitch& find_switch(int64_t switch_id, const char* op) {
  const auto it = graph_switches.find(switch_id);
  TORCH_CHECK(it != graph_switches.end(), op, ": no open graph switch ", switch_id);
  return it->second;
}

int64_t graph_switch_begin(const at::Tensor& index, int64_t num_branches, int64_t pool_first, int64_t pool_second) {
  constexpr const char* op = "graph_switch_begin";
  check_switch_index(index, op);
  TORCH_CHECK(num_branches >= 1 && num_branches <= 1024, op, ": num_branches = ", num_branches,
              " must be in [1, 1024]");
  const c10::cuda::CUDAGuard guard(index.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  CaptureInfo info = capture_info(stream);
  TORCH_CHECK(info.status == cudaStreamCaptureStatusActive, op,
              ": the current stream is not capturing; add a switch inside torch.cuda.graph(...)");
  cudaGraphConditionalHandle handle{};
  C10_CUDA_CHECK(cudaGraphConditionalHandleCreate(&handle, info.graph, 0, 0));
  check_launch(SetGraphSwitch(handle, index.const_data_ptr<int64_t>(), num_branches, stream), op);
  info = capture_info(stream);  // the kernel just captured is now what the switch node follows

  cudaGraphNodeParams params{};
  params.type = cudaGraphNodeTypeConditional;
  params.conditional.handle = handle;
  params.conditional.type = cudaGraphCondTypeSwitch;
  params.conditional.size = static_cast<unsigned>(num_branches);
  cudaGraphNode_t node{};
  C10_CUDA_CHECK(cudaGraphAddNode(&node, info.graph, info.dependencies, info.edges, info.num_dependencies, &params));
  C10_CUDA_CHECK(cudaStreamUpdateCaptureDependencies(stream, &node, nullptr, 1, cudaStreamSetCaptureDependencies));

  const std::lock_guard<std::mutex> lock(graph_switches_mutex);
  const int64_t id = next_graph_switch++;
  graph_switches[id] = GraphSwitch{
      std::vector<cudaGraph_t>(params.conditional.phGraph_out, params.conditional.phGraph_out + num_branches),
      info.id, {static_cast<c10::CaptureId_t>(pool_first), static_cast<c10::CaptureId_t>(pool_second)},
      index.get_device()};
  return id;
}

void graph_branch_begin(const at::Tensor& index, int64_t switch_id, int64_t branch) {
  constexpr const char* op = "graph_branch_begin";
  check_switch_index(index, op);
  const c10::cuda::CUDAGuard guard(index.device());
  const std::lock_guard<std::mutex> lock(graph_switches_mutex);
  const GraphSwitch& sw = find_switch(switch_id, op);
  TORCH_CHECK(branch >= 0 && branch < static_cast<int64_t>(sw.branches.size()), op, ": branch ", branch,
              " is not one of the switch's ", sw.branches.size());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  TORCH_CHECK(capture_info(stream).status == cudaStreamCaptureStatusNone, op,
              ": capture a branch on a side stream that is not capturing (with torch.cuda.stream(side))");
  C10_CUDA_CHECK(cudaStreamBeginCaptureToGraph(stream, sw.branches[branch], nullptr, nullptr, 0,
                                               cudaStreamCaptureModeGlobal));
  allocate_to_capture(sw, capture_info(stream).id);
}

void graph_branch_end(const at::Tensor& index, int64_t switch_id) {
  constexpr const char* op = "graph_branch_end";
  check_switch_index(index, op);
  const c10::cuda::CUDAGuard guard(index.device());
  const std::lock_guard<std::mutex> lock(graph_switches_mutex);
  const GraphSwitch& sw = find_switch(switch_id, op);
  cudaGraph_t body = nullptr;
  C10_CUDA_CHECK(cudaStreamEndCapture(c10::cuda::getCurrentCUDAStream(), &body));
  allocate_to_capture(sw, sw.parent_capture);
}

void graph_switch_end(const at::Tensor& index, int64_t switch_id) {
  constexpr const char* op = "graph_switch_end";
  check_switch_index(index, op);
  const std::lock_guard<std::mutex> lock(graph_switches_mutex);
  find_switch(switch_id, op);
  graph_switches.erase(switch_id);
}

// -- graph upload (kernels/graph_upload.py) ------------------------------------------------------------------------
// Without it a graph's first replay uploads it, so the first replay of a large graph costs several replays.

// rms_norm_rows' launch arguments, which add_rms_norm's norm shares: x [M, D] normed by weight into y.
RmsNormRowsArgs norm_rows_args(const at::Tensor& x, const at::Tensor& weight, double eps, at::Tensor& y,
                               const char* op) {
  RmsNormRowsArgs args{};
  args.x = x.const_data_ptr();
  args.row_stride = x.stride(0);
  args.weight = weight.const_data_ptr();
  args.y = y.mutable_data_ptr();
  args.num_rows = as_int(x.size(0), op, "M (x.size(0))");
  args.width = as_int(x.size(1), op, "D (x.size(1))");
  args.eps = static_cast<float>(eps);
  args.bf16 = x.scalar_type() == at::kBFloat16;
  args.weight_f32 = weight.scalar_type() == at::kFloat;
  return args;
}

at::Tensor rms_norm_rows(const at::Tensor& x, const at::Tensor& weight, double eps) {
  constexpr const char* op = "rms_norm_rows";
  check_rms_norm_rows_args(x, weight, eps);
  check_on_cuda(x, op, "x");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty(x.sizes(), x.options());
  check_launch(RmsNormRows(norm_rows_args(x, weight, eps, y, op), c10::cuda::getCurrentCUDAStream()), op);
  return y;
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight,
                                                double eps) {
  constexpr const char* op = "add_rms_norm";
  check_add_rms_norm_args(x, delta, weight, eps);
  check_on_cuda(x, op, "x");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor sum = at::empty(x.sizes(), x.options());
  at::Tensor y = at::empty(x.sizes(), x.options());
  AddRmsNormArgs args{};
  args.norm = norm_rows_args(x, weight, eps, y, op);
  args.delta = delta.const_data_ptr();
  args.delta_stride = delta.stride(0);
  args.sum = sum.mutable_data_ptr();
  check_launch(AddRmsNorm(args, c10::cuda::getCurrentCUDAStream()), op);
  return {sum, y};
}

at::Tensor silu_mul(const at::Tensor& gate_up) {
  constexpr const char* op = "silu_mul";
  check_silu_mul_args(gate_up);
  check_on_cuda(gate_up, op, "gate_up");
  const c10::cuda::CUDAGuard guard(gate_up.device());
  at::Tensor out = at::empty({gate_up.size(0), gate_up.size(1) / 2}, gate_up.options());
  SiluMulArgs args{};
  args.gate_up = gate_up.const_data_ptr();
  args.row_stride = gate_up.stride(0);
  args.out = out.mutable_data_ptr();
  args.num_rows = as_int(gate_up.size(0), op, "M (gate_up.size(0))");
  args.width = as_int(out.size(1), op, "I (gate_up.size(1) / 2)");
  args.bf16 = gate_up.scalar_type() == at::kBFloat16;
  check_launch(SiluMul(args, c10::cuda::getCurrentCUDAStream()), op);
  return out;
}

at::Tensor router_logits(const at::Tensor& x, const at::Tensor& weight) {
  constexpr const char* op = "router_logits";
  check_router_logits_args(x, weight);
  check_on_cuda(x, op, "x");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty({x.size(0), weight.size(0)}, x.options().dtype(at::kFloat));
  RouterLogitsArgs args{};
  args.x = x.const_data_ptr();
  args.row_stride = x.stride(0);
  args.weight = weight.const_data_ptr<float>();
  args.out = out.mutable_data_ptr<float>();
  args.num_rows = as_int(x.size(0), op, "N (x.size(0))");
  args.num_experts = as_int(weight.size(0), op, "E (weight.size(0))");
  args.width = as_int(x.size(1), op, "H (x.size(1))");
  args.bf16 = x.scalar_type() == at::kBFloat16;
  check_launch(RouterLogits(args, c10::cuda::getCurrentCUDAStream()), op);
  return out;
}

std::tuple<at::Tensor, at::Tensor> moe_route(const at::Tensor& logits, const at::Tensor& bias, int64_t top_k,
                                             int64_t num_groups, int64_t top_groups, bool softmax, bool normalize,
                                             double scaling, const std::optional<at::Tensor>& counts,
                                             const std::optional<at::Tensor>& real) {
  constexpr const char* op = "moe_route";
  check_moe_route_args(logits, bias, top_k, num_groups, top_groups, counts, real);
  check_on_cuda(logits, op, "logits");
  check_on_cuda(bias, op, "bias");
  if (counts.has_value()) check_on_cuda(*counts, op, "counts");
  if (real.has_value()) check_on_cuda(*real, op, "real");
  const c10::cuda::CUDAGuard guard(logits.device());
  const int64_t num_rows = logits.size(0);
  at::Tensor idx = at::empty({num_rows, top_k}, logits.options().dtype(at::kLong));
  at::Tensor weights = at::empty({num_rows, top_k}, logits.options());
  MoeRouteArgs args{};
  args.logits = logits.const_data_ptr<float>();
  args.bias = bias.const_data_ptr<float>();
  args.num_rows = as_int(num_rows, op, "N (logits.size(0))");
  args.num_experts = static_cast<int>(logits.size(1));  // the checks bound E, k, G and top_groups by kMaxExperts
  args.top_k = static_cast<int>(top_k);
  args.num_groups = static_cast<int>(num_groups);
  args.top_groups = static_cast<int>(top_groups);
  args.softmax = softmax;
  args.normalize = normalize;
  args.scaling = static_cast<float>(scaling);
  args.idx = idx.mutable_data_ptr<int64_t>();
  args.weights = weights.mutable_data_ptr<float>();
  args.counts = counts.has_value() ? counts->mutable_data_ptr<int32_t>() : nullptr;
  args.real = real.has_value() ? real->const_data_ptr<bool>() : nullptr;
  check_launch(MoeRoute(args, c10::cuda::getCurrentCUDAStream()), op);
  return {idx, weights};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> expert_rows(const at::Tensor& x, const at::Tensor& idx,
                                                           int64_t num_experts) {
  constexpr const char* op = "expert_rows";
  check_expert_rows_args(x, idx, num_experts);
  check_on_cuda(x, op, "x");
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t num_assignments = idx.numel();
  at::Tensor rows = at::empty({num_assignments, x.size(1)}, x.options());
  at::Tensor slots = at::empty_like(idx);
  at::Tensor group_ends = at::empty({num_experts}, idx.options().dtype(at::kInt));
  ExpertRowsArgs args{};
  args.x = x.const_data_ptr();
  args.x_row_bytes = x.stride(0) * static_cast<int64_t>(x.element_size());
  args.row_bytes = as_int(x.size(1) * static_cast<int64_t>(x.element_size()), op, "a row's bytes");
  args.idx = idx.const_data_ptr<int64_t>();
  args.num_assignments = as_int(num_assignments, op, "N k (idx.numel())");
  args.top_k = std::max(1, static_cast<int>(idx.size(1)));
  args.num_experts = static_cast<int>(num_experts);
  args.rows = rows.mutable_data_ptr();
  args.slots = slots.mutable_data_ptr<int64_t>();
  args.group_ends = group_ends.mutable_data_ptr<int32_t>();
  check_launch(ExpertRows(args, c10::cuda::getCurrentCUDAStream()), op);
  return {rows, slots, group_ends};
}

at::Tensor expert_combine(const at::Tensor& out, const at::Tensor& slots, const at::Tensor& weights,
                          const at::Tensor& group_ends) {
  constexpr const char* op = "expert_combine";
  check_expert_combine_args(out, slots, weights, group_ends);
  check_on_cuda(out, op, "out");
  const c10::cuda::CUDAGuard guard(out.device());
  at::Tensor y = at::empty({slots.size(0), out.size(1)}, out.options());
  ExpertCombineArgs args{};
  args.out = out.const_data_ptr();
  args.out_row_stride = out.stride(0);
  args.num_out_rows = as_int(out.size(0), op, "M (out.size(0))");
  args.width = as_int(out.size(1), op, "H (out.size(1))");
  args.slots = slots.const_data_ptr<int64_t>();
  args.weights = weights.const_data_ptr<float>();
  args.group_ends = group_ends.const_data_ptr<int32_t>();
  args.num_experts = as_int(group_ends.size(0), op, "E (group_ends.size(0))");
  args.num_tokens = as_int(slots.size(0), op, "N (slots.size(0))");
  args.top_k = as_int(slots.size(1), op, "k (slots.size(1))");
  args.y = y.mutable_data_ptr();
  args.bf16 = out.scalar_type() == at::kBFloat16;
  check_launch(ExpertCombine(args, c10::cuda::getCurrentCUDAStream()), op);
  return y;
}

at::Tensor cache_attn(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                      const at::Tensor& num_visible, double scale) {
  constexpr const char* op = "cache_attn";
  check_cache_attn_args(q, keys, values, num_visible, scale);
  check_on_cuda(q, op, "q");
  const c10::cuda::CUDAGuard guard(q.device());
  CacheAttnArgs args{};
  args.q = q.const_data_ptr();
  args.q_row_stride = q.stride(0);
  args.keys = keys.const_data_ptr();
  args.values = values.const_data_ptr();
  args.num_visible = num_visible.const_data_ptr<int64_t>();
  args.num_nodes = as_int(q.size(0), op, "N (q.size(0))");
  args.num_heads = as_int(q.size(1), op, "Hq (q.size(1))");
  args.num_kv_heads = as_int(keys.size(1), op, "Hkv (keys.size(1))");
  args.head_dim = as_int(q.size(2), op, "D (q.size(2))");
  args.cache_rows = as_int(keys.size(0), op, "S (keys.size(0))");
  args.scale = static_cast<float>(scale);
  if (q.scalar_type() != at::kBFloat16 || !CacheAttnSupported(args)) {
    return cache_attn_torch(q, keys, values, num_visible.clamp(1, keys.size(0)), scale);
  }
  int num_sms = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, q.get_device()));
  args.num_splits = CacheAttnSplits(args.num_nodes, args.num_heads, args.num_kv_heads, args.cache_rows, num_sms);
  const int64_t num_rows = static_cast<int64_t>(args.num_splits) * q.size(0) * q.size(1);  // splits x Hkv x N G
  at::Tensor partial_o = at::empty({num_rows, q.size(2)}, q.options().dtype(at::kFloat));
  at::Tensor partial_ml = at::empty({num_rows, 2}, q.options().dtype(at::kFloat));
  at::Tensor out = at::empty(q.sizes(), q.options());
  args.partial_o = partial_o.mutable_data_ptr<float>();
  args.partial_ml = partial_ml.mutable_data_ptr<float>();
  args.out = out.mutable_data_ptr();
  check_launch(CacheAttn(args, c10::cuda::getCurrentCUDAStream()), op);
  return out;
}

at::Tensor head_norm_rope(const at::Tensor& x, const std::optional<at::Tensor>& weight, const at::Tensor& cos,
                          const at::Tensor& sin, double eps, bool interleave) {
  constexpr const char* op = "head_norm_rope";
  check_head_norm_rope_args(x, weight, cos, sin, eps);
  check_on_cuda(x, op, "x");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty(x.sizes(), x.options());
  HeadNormRopeArgs args{};
  args.x = x.const_data_ptr();
  args.row_stride = x.stride(0);
  args.head_stride = x.stride(1);
  args.weight = weight.has_value() ? weight->const_data_ptr() : nullptr;
  args.cos = cos.const_data_ptr<float>();
  args.sin = sin.const_data_ptr<float>();
  args.y = y.mutable_data_ptr();
  args.num_rows = as_int(x.size(0), op, "M (x.size(0))");
  args.num_heads = as_int(x.size(1), op, "H (x.size(1))");
  as_int(x.size(0) * x.size(1), op, "M * H");
  args.head_dim = as_int(x.size(2), op, "D (x.size(2))");
  args.eps = static_cast<float>(eps);
  args.bf16 = x.scalar_type() == at::kBFloat16;
  args.weight_f32 = weight.has_value() && weight->scalar_type() == at::kFloat;
  args.interleave = interleave;
  check_launch(HeadNormRope(args, c10::cuda::getCurrentCUDAStream()), op);
  return y;
}

void latent_write(const at::Tensor& kv, const at::Tensor& weight, const at::Tensor& cos, const at::Tensor& sin,
                  double eps, bool interleave, const at::Tensor& ckv, const at::Tensor& kpe, const at::Tensor& rows) {
  constexpr const char* op = "latent_write";
  check_latent_write_args(kv, weight, cos, sin, eps, ckv, kpe, rows);
  check_on_cuda(kv, op, "kv");
  const c10::cuda::CUDAGuard guard(kv.device());
  LatentWriteArgs args{};
  args.kv = kv.const_data_ptr();
  args.kv_stride = kv.stride(0);
  args.weight = weight.const_data_ptr();
  args.cos = cos.const_data_ptr<float>();
  args.sin = sin.const_data_ptr<float>();
  args.rows = rows.const_data_ptr<int64_t>();
  args.rows_stride = rows.stride(0);
  args.ckv = ckv.mutable_data_ptr();
  args.kpe = kpe.mutable_data_ptr();
  args.cache_rows = ckv.size(0);
  args.num_rows = as_int(kv.size(0), op, "N (kv.size(0))");
  args.lat_dim = as_int(ckv.size(1), op, "R (ckv.size(1))");
  args.rope_dim = static_cast<int>(kpe.size(1));  // the checks bound P by kMaxHeadNormRopeDim
  args.eps = static_cast<float>(eps);
  args.bf16 = kv.scalar_type() == at::kBFloat16;
  args.weight_f32 = weight.scalar_type() == at::kFloat;
  args.interleave = interleave;
  check_launch(LatentWrite(args, c10::cuda::getCurrentCUDAStream()), op);
}

void context_write(const at::Tensor& kv, const at::Tensor& k_norm, const at::Tensor& rope, const at::Tensor& start,
                   double eps, const at::Tensor& keys, const at::Tensor& values) {
  constexpr const char* op = "context_write";
  check_context_write_args(kv, k_norm, rope, start, eps, keys, values);
  check_on_cuda(kv, op, "kv");
  const c10::cuda::CUDAGuard guard(kv.device());
  ContextWriteArgs args{};
  args.kv = kv.const_data_ptr();
  args.kv_stride = kv.stride(0);
  args.k_norm = k_norm.const_data_ptr();
  args.rope = rope.const_data_ptr<float>();
  args.num_angles = rope.size(1);
  args.start = start.const_data_ptr<int64_t>();
  args.keys = keys.mutable_data_ptr();
  args.values = values.mutable_data_ptr();
  args.cache_rows = keys.size(1);
  args.num_rows = as_int(kv.size(0), op, "n (kv.size(0))");
  args.num_groups = as_int(k_norm.size(0), op, "G (k_norm.size(0))");
  as_int(kv.size(0) * k_norm.size(0), op, "n * G");
  args.num_kv_heads = as_int(keys.size(2), op, "Hkv (keys.size(2))");
  args.head_dim = static_cast<int>(keys.size(3));  // the checks bound D by kMaxHeadNormRopeDim
  args.eps = static_cast<float>(eps);
  args.bf16 = kv.scalar_type() == at::kBFloat16;
  args.norm_f32 = k_norm.scalar_type() == at::kFloat;
  check_launch(ContextWrite(args, c10::cuda::getCurrentCUDAStream()), op);
}

void graph_upload(int64_t graph_exec) {
  TORCH_CHECK(graph_exec != 0, "graph_upload: graph_exec is 0; pass graph.raw_cuda_graph_exec() of a ",
              "torch.cuda.CUDAGraph whose capture has ended");
  C10_CUDA_CHECK(cudaGraphUpload(reinterpret_cast<cudaGraphExec_t>(static_cast<uintptr_t>(graph_exec)),
                                 c10::cuda::getCurrentCUDAStream()));
}

}  // namespace
}  // namespace ddtree::cuda

// No tensor argument picks a backend, so the dispatcher reaches graph_upload through this key.
TORCH_LIBRARY_IMPL(ddtree, CompositeImplicitAutograd, m) { m.impl("graph_upload", &ddtree::cuda::graph_upload); }

TORCH_LIBRARY_IMPL(ddtree, CUDA, m) {
  m.impl("tree_build", &ddtree::cuda::tree_build);
  m.impl("verify_attn", &ddtree::cuda::verify_attn);
  m.impl("tree_accept", &ddtree::cuda::tree_accept);
  m.impl("kv_compact", &ddtree::cuda::kv_compact);
  m.impl("commit_path", &ddtree::cuda::commit_path);
  m.impl("budget_choose", &ddtree::cuda::budget_choose);
  m.impl("confidence_learn", &ddtree::cuda::confidence_learn);
  m.impl("linear_rows", &ddtree::cuda::linear_rows);
  m.impl("rms_norm_rows", &ddtree::cuda::rms_norm_rows);
  m.impl("add_rms_norm", &ddtree::cuda::add_rms_norm);
  m.impl("silu_mul", &ddtree::cuda::silu_mul);
  m.impl("router_logits", &ddtree::cuda::router_logits);
  m.impl("moe_route", &ddtree::cuda::moe_route);
  m.impl("expert_rows", &ddtree::cuda::expert_rows);
  m.impl("expert_combine", &ddtree::cuda::expert_combine);
  m.impl("cache_attn", &ddtree::cuda::cache_attn);
  m.impl("head_norm_rope", &ddtree::cuda::head_norm_rope);
  m.impl("latent_write", &ddtree::cuda::latent_write);
  m.impl("context_write", &ddtree::cuda::context_write);
  m.impl("graph_switch_begin", &ddtree::cuda::graph_switch_begin);
  m.impl("graph_branch_begin", &ddtree::cuda::graph_branch_begin);
  m.impl("graph_branch_end", &ddtree::cuda::graph_branch_end);
  m.impl("graph_switch_end", &ddtree::cuda::graph_switch_end);
}
