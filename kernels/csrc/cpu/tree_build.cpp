// Best-first draft tree construction on the CPU (contract: kernels/ops.py): each depth's top K
// (tree_topk.cpp), then the best-first heap over those L * K candidates, stopped after budget_limit pops.
#include <algorithm>
#include <limits>
#include <queue>
#include <vector>

#include "../checks.h"
#include "../tree_outputs.h"
#include "cpu_ops.h"
#include "tree_topk.h"

namespace ddtree::cpu {
namespace {

// A node that may be popped next: the rank-th candidate of depth `depth` under node `parent`.
struct Candidate {
  float score;
  int64_t depth;
  int64_t rank;
  int64_t parent;
};

// Heap order: higher score first, then lower depth, rank, parent. (depth, rank, parent) names a candidate
// uniquely, so this is a total order and every backend pops the same sequence.
struct PopsLater {
  bool operator()(const Candidate& a, const Candidate& b) const {
    if (a.score != b.score) return a.score < b.score;
    if (a.depth != b.depth) return a.depth > b.depth;
    if (a.rank != b.rank) return a.rank > b.rank;
    return a.parent > b.parent;
  }
};

}  // namespace

TreeBuildOutputs tree_build(const at::Tensor& draft_logprobs, const at::Tensor& root_token, int64_t budget,
                            const std::optional<at::Tensor>& budget_limit) {
  check_tree_build_args(draft_logprobs, root_token, budget);
  check_budget_limit(budget_limit, draft_logprobs);
  int64_t num_popped = budget;  // the nodes past the root that are built; the rest is padding
  if (budget_limit.has_value()) {
    num_popped = *budget_limit->const_data_ptr<int64_t>();
    TORCH_CHECK(num_popped >= 0 && num_popped <= budget, "budget_limit must be in [0, budget = ", budget, "], got ",
                num_popped);
  }
  const int64_t num_depths = draft_logprobs.size(0);
  const int64_t vocab = draft_logprobs.size(1);
  const float* logprobs = draft_logprobs.const_data_ptr<float>();
  const int64_t root = *root_token.const_data_ptr<int64_t>();
  TORCH_CHECK(root >= 0, "root_token must be a token id >= 0, got ", root);

  const int64_t k = std::min(budget, vocab);
  std::vector<int64_t> cand_tokens;  // [L, K]
  std::vector<float> cand_logprobs;  // [L, K]
  tree_top_k(logprobs, num_depths, vocab, k, cand_tokens, cand_logprobs);

  const int64_t num_nodes = budget + 1;
  TreeBuildOutputs outputs = empty_tree_build_outputs(draft_logprobs, budget);
  auto& [tokens, parents, depths, ranks, scores, visibility] = outputs;
  int64_t* tok = tokens.mutable_data_ptr<int64_t>();
  int64_t* par = parents.mutable_data_ptr<int64_t>();
  int64_t* dep = depths.mutable_data_ptr<int64_t>();
  int64_t* rnk = ranks.mutable_data_ptr<int64_t>();
  float* score = scores.mutable_data_ptr<float>();
  bool* vis = visibility.mutable_data_ptr<bool>();  // [B+1, B+1]
  std::fill_n(vis, num_nodes * num_nodes, false);  // not zero_(): waking torch's threads costs more than this

  // Node 0 is the root; padding nodes look like it but score -inf and have no parent.
  for (int64_t n = 0; n < num_nodes; ++n) {
    tok[n] = root;
    par[n] = -1;
    dep[n] = 0;
    rnk[n] = 0;
    score[n] = n == 0 ? 0.0f : -std::numeric_limits<float>::infinity();
    vis[n * num_nodes + n] = true;
  }

  std::priority_queue<Candidate, std::vector<Candidate>, PopsLater> heap;
  if (k > 0) heap.push({cand_logprobs[0], 1, 0, 0});
  for (int64_t n = 1; n <= num_popped && !heap.empty(); ++n) {
    const Candidate c = heap.top();
    heap.pop();
    const int64_t row = c.depth - 1;
    tok[n] = cand_tokens[row * k + c.rank];
    par[n] = c.parent;
    dep[n] = c.depth;
    rnk[n] = c.rank;
    score[n] = c.score;
    std::copy_n(vis + c.parent * num_nodes, n, vis + n * num_nodes);
    if (c.rank + 1 < k) {
      heap.push({score[c.parent] + cand_logprobs[row * k + c.rank + 1], c.depth, c.rank + 1, c.parent});
    }
    if (c.depth < num_depths) heap.push({c.score + cand_logprobs[c.depth * k], c.depth + 1, 0, n});
  }
  return outputs;
}

}  // namespace ddtree::cpu
