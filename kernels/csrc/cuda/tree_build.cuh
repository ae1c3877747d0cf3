// Best-first draft tree on the GPU (contract: kernels/ops.py), with no host round trip.
//
// One memset and three launches on one stream:
//   1. top-k histogram (tree_topk.cu), grid (vocabulary chunk, row): each row's 2048-bin histogram of its
//      logprobs' keys (the top 11 bits of the order-preserving float key), block histograms added into a
//      zeroed workspace; the blocks also zero the visibility matrix;
//   2. top-k gather, same grid: each block finds its row's threshold bin (the one holding the k-th largest
//      key) and collects its chunk's keys in that bin and above; the row's last block to finish (fence and
//      counter, no wait) selects the k best of the collected keys and sorts them -> top k tokens and
//      logprobs. A row with too many keys in the threshold bin (many equal logprobs) has each block keep
//      its chunk's k best of them instead;
//   3. one block (tree_build.cu): the tree, then the outputs and each node's visibility row (its ancestors
//      and itself). The tree comes from the threshold build (tree_threshold.cuh: every node above a score
//      threshold listed level by level in parallel, then sorted), or, where that does not apply (a positive
//      logprob) or gives up, from the heap (tree_heap.cuh: B serial pops on one warp).
// Kernels 2 and 3 are launched as programmatic dependents (sm_90): each starts while the one before it drains
// and waits for it only where it reads its results.
// Candidates are ordered by a 64-bit key, (order-preserving float key << 32) | ~token, so ties go to the
// lower token as in the CPU op, and the heap's total order (score, then lower depth, rank, parent) is one
// 64-bit key too. The result equals the CPU op's, ties included, whichever way the tree is built. Where
// the CPU op rejects NaN, this one cannot raise without a host sync: a NaN logprob orders like -inf.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ddtree::cuda {

constexpr int kTreeBuildMaxBudget = 1024;
// Rows of draft_logprobs a tree can reach, min(L, budget): their top-k logprobs sit in shared memory.
constexpr int kTreeBuildMaxDepth = 32;

// How the one-block stage builds the tree. kThreshold is for testing and comparing: where the threshold
// build does not apply or gives up, the tree comes back empty (every node after the root is padding).
enum class TreeBuildMethod { kAuto, kHeap, kThreshold };

struct TreeBuildArgs {
  const float* draft_logprobs;  // [L, V]
  const int64_t* root_token;    // 0-dim, on the device
  int num_depths;               // L
  int vocab;                    // V
  int budget;                   // B
  const int64_t* budget_limit;  // 0-dim on the device, or null: pop at most this many nodes (clamped to [0, B])
  void* workspace;              // TreeBuildWorkspaceBytes(L, V, B) bytes
  int64_t* tokens;              // [B+1]
  int64_t* parents;             // [B+1]
  int64_t* depths;              // [B+1]
  int64_t* ranks;               // [B+1]
  float* scores;                // [B+1]
  bool* visibility;             // [B+1, B+1]
  TreeBuildMethod method;
};

// The largest vocabulary the top-k stages handle for this budget (it bounds the candidate buffers in the
// workspace); 524288 at budget 1024, more for smaller budgets.
int64_t TreeBuildMaxVocab(int budget);

size_t TreeBuildWorkspaceBytes(int num_depths, int vocab, int budget);

cudaError_t TreeBuild(const TreeBuildArgs& args, cudaStream_t stream);

}  // namespace ddtree::cuda
