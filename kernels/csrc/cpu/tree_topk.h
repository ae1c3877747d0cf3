// Each depth's candidates for tree_build on the CPU (tree_topk.cpp).
#pragma once

#include <cstdint>
#include <vector>

namespace ddtree::cpu {

// The top k tokens of each of the num_rows rows of logprobs [num_rows, vocab] by (logprob descending, token
// ascending), into tokens and values [num_rows, k]; a NaN is an error naming the first one in row-major order.
void tree_top_k(const float* logprobs, int64_t num_rows, int64_t vocab, int64_t k, std::vector<int64_t>& tokens,
                std::vector<float>& values);

}  // namespace ddtree::cpu
