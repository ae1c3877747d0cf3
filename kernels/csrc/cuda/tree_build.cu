// Best-first draft tree kernels (design: tree_build.cuh): the top-k (tree_topk.cu), then one block that builds
// the tree (tree_threshold.cuh, or the heap of tree_heap.cuh) and writes the outputs.
#include <algorithm>

#include "common.cuh"
#include "tree_build.cuh"
#include "tree_heap.cuh"
#include "tree_threshold.cuh"
#include "tree_topk.cuh"

namespace ddtree::cuda {
namespace {

constexpr int kSelectThreads = kThresholdThreads;
// Below this budget `auto` pops the heap: the threshold build's fixed cost (the first threshold's search, a
// pass per level, the sort) outweighs B serial pops (H200, V = 163840: 29.7 vs 24.5 us at B = 16, even at 64).
constexpr int kThresholdMinBudget = 64;

// Whether some depth's top-k holds its middle and last entries at one logprob (an oracle's floor tokens: 163,832 tied
// at V = 163840): then many nodes tie at any threshold, which the threshold build orders by parent level by level,
// and `auto` pops the heap, which costs less there (H100, V = 163840, L = 15, the exact oracle's draft: 132 against
// 175 us at B = 256, 73 against 104 at B = 64; random drafts tie no such half and keep the threshold build). Every
// thread reads the same entries, so the block agrees.
__device__ __forceinline__ bool half_tied(const float* logprobs, int num_rows, int k) {
  if (k < 2) return false;
  for (int r = 0; r < num_rows; ++r) {
    if (logprobs[r * k + k / 2] == logprobs[r * k + k - 1]) return true;
  }
  return false;
}

struct SelectArgs {
  TopKResult topk;  // [rows, k] logprobs and tokens
  int num_rows;
  int k;
  TreeBuildArgs out;
};

size_t select_smem_bytes(int budget, int num_rows, int k) {
  return static_cast<size_t>(heap_slots(budget) + budget + 1) * sizeof(uint64_t) +
         threshold_smem_bytes(budget, num_rows) + static_cast<size_t>(num_rows) * k * sizeof(float);
}

// One block: the tree (the threshold build; the heap on warp 0 when heap_only, below kThresholdMinBudget pops, on a
// half-tied top-k or where the threshold build gives up), the node arrays and the visibility rows (the matrix was
// zeroed by the top-k). It pops `budget` nodes, min(B, budget_limit): the shared memory's layout for that many is a
// prefix of the one for B, and the first n pops do not depend on K as long as K >= n (a rank-r node follows its r
// siblings), so the top-k's K = min(B, V) serves every limit; the nodes after the pops are padding.
__device__ __forceinline__ void select_tree(const SelectArgs& args, bool heap_only) {
  extern __shared__ uint64_t smem[];
  __shared__ int s_num_popped;
  __shared__ ThresholdShared threshold_shared;
  const TreeBuildArgs& out = args.out;
  const int num_nodes = out.budget + 1;  // the outputs' length
  const int64_t limit = out.budget_limit == nullptr ? out.budget : *out.budget_limit;
  const int budget = static_cast<int>(limit < 0 ? 0 : (limit > out.budget ? out.budget : limit));
  heap_only = heap_only || (out.method == TreeBuildMethod::kAuto && budget < kThresholdMinBudget);
  const int k = args.k;
  const int capacity = threshold_capacity(budget);
  HeapSmem heap;
  heap.entry = smem;
  heap.popped = heap.entry + heap_slots(budget);
  ThresholdSmem threshold;
  threshold.keys = heap.popped + num_nodes;
  threshold.scratch = reinterpret_cast<int32_t*>(threshold.keys + capacity);
  threshold.path_scores = reinterpret_cast<float*>(threshold.scratch + capacity + 1);
  float* logprobs = threshold.path_scores + args.num_rows;
  threshold.parent = reinterpret_cast<uint16_t*>(logprobs + args.num_rows * k);
  for (int i = threadIdx.x; i < heap_slots(budget); i += blockDim.x) heap.entry[i] = 0;
  wait_for_previous_grid();  // the top-k
  for (int i = threadIdx.x; i < args.num_rows * k; i += blockDim.x) logprobs[i] = args.topk.logprobs[i];
  __syncthreads();
  heap_only = heap_only || (out.method == TreeBuildMethod::kAuto && half_tied(logprobs, args.num_rows, k));

  int num_popped =
      heap_only ? -1 : threshold_build(logprobs, args.num_rows, k, budget, heap.popped, threshold, threshold_shared);
  if (num_popped < 0 && out.method == TreeBuildMethod::kThreshold) num_popped = 0;
  if (num_popped < 0 && threadIdx.x < kWarpSize) {
    const int n = run_best_first(heap, logprobs, args.num_rows, k, budget);
    if (threadIdx.x == 0) s_num_popped = n;
  }
  __syncthreads();  // every popped entry is written before the ancestor walks below read them
  if (num_popped < 0) num_popped = s_num_popped;

  const int64_t root = *out.root_token;
  for (int n = threadIdx.x; n < num_nodes; n += blockDim.x) {
    bool* vis_row = out.visibility + static_cast<size_t>(n) * num_nodes;
    if (n >= 1 && n <= num_popped) {
      const uint64_t entry = heap.popped[n];
      const int depth = entry_depth(entry);
      const int rank = entry_rank(entry);
      out.tokens[n] = args.topk.tokens[(depth - 1) * k + rank];
      out.parents[n] = entry_parent(entry);
      out.depths[n] = depth;
      out.ranks[n] = rank;
      out.scores[n] = entry_score(entry);
      vis_row[0] = true;
      for (int j = n; j > 0; j = entry_parent(heap.popped[j])) vis_row[j] = true;
    } else {  // the root, or padding after the heap ran dry
      out.tokens[n] = root;
      out.parents[n] = -1;
      out.depths[n] = 0;
      out.ranks[n] = 0;
      out.scores[n] = n == 0 ? 0.0f : neg_inf();
      vis_row[n] = true;
    }
  }
}

// Two entry points, so that a profile's kernel names say which build ran (profiling/capture_view.py reads them;
// the threshold kernel's fallback to the heap happens inside it and does not show).
__global__ void __launch_bounds__(kSelectThreads) tree_build_heap_kernel(SelectArgs args) { select_tree(args, true); }
__global__ void __launch_bounds__(kSelectThreads) tree_build_threshold_kernel(SelectArgs args) {
  select_tree(args, false);
}

}  // namespace

size_t TreeBuildWorkspaceBytes(int num_depths, int vocab, int budget) {
  return TopKWorkspaceBytes(MakeTopKPlan(num_depths, vocab, budget));
}

cudaError_t TreeBuild(const TreeBuildArgs& args, cudaStream_t stream) {
  if (args.budget < 0 || args.budget > kTreeBuildMaxBudget || args.num_depths < 1 || args.vocab < 1 ||
      args.vocab > TreeBuildMaxVocab(args.budget) || std::min(args.num_depths, args.budget) > kTreeBuildMaxDepth) {
    return cudaErrorInvalidValue;
  }
  const TopKPlan plan = MakeTopKPlan(args.num_depths, args.vocab, args.budget);
  if (plan.num_rows > 0) {  // budget > 0; it also zeroes the visibility matrix
    const size_t num_nodes = static_cast<size_t>(args.budget) + 1;
    DDTREE_CUDA_TRY(TopK(args.draft_logprobs, args.vocab, plan, args.workspace,
                         reinterpret_cast<uint8_t*>(args.visibility), num_nodes * num_nodes, stream));
  }
  const SelectArgs select{TopKResultIn(args.workspace, plan), plan.num_rows, plan.k, args};
  const size_t smem = select_smem_bytes(args.budget, plan.num_rows, plan.k);
  const bool heap_only = args.method == TreeBuildMethod::kHeap ||
                         (args.method == TreeBuildMethod::kAuto && args.budget < kThresholdMinBudget);
  const auto kernel = heap_only ? tree_build_heap_kernel : tree_build_threshold_kernel;
  DDTREE_CUDA_TRY(allow_dynamic_smem(kernel, smem));
  return launch_dependent(kernel, 1, kSelectThreads, smem, stream, select);
}

}  // namespace ddtree::cuda
