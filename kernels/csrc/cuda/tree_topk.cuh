// Top-k stages of tree_build: each reachable row's k = min(B, V) best tokens, sorted by logprob descending
// (ties to the lower token). The design is in tree_build.cuh; this is the interface tree_build.cu uses.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ddtree::cuda {

// How the vocabulary of each reachable row is cut for the top-k stages.
struct TopKPlan {
  int num_rows;      // min(L, B): deeper rows are out of reach of B pops
  int k;             // min(B, V)
  int num_chunks;    // per row, one block's entries each (the last one shorter)
  int sort_len;      // k rounded up to a power of two
  int max_gathered;  // candidates per row: a fixed bound, or each chunk's k best in a tie-heavy row
};

TopKPlan MakeTopKPlan(int num_depths, int vocab, int budget);

size_t TopKWorkspaceBytes(const TopKPlan& plan);

// Where the result sits in the workspace: [rows, k] logprobs, descending, and their tokens.
struct TopKResult {
  const float* logprobs;
  const int32_t* tokens;
};
TopKResult TopKResultIn(void* workspace, const TopKPlan& plan);

// Launches the top-k (a memset and two kernels). The histogram kernel's blocks also zero `clear_bytes` bytes
// at `clear` on the way (tree_build's visibility matrix), so that costs no launch of its own.
cudaError_t TopK(const float* logprobs, int vocab, const TopKPlan& plan, void* workspace, uint8_t* clear,
                 size_t clear_bytes, cudaStream_t stream);

}  // namespace ddtree::cuda
