// Greedy acceptance walk down the verified tree, on the GPU (contract: kernels/ops.py).
//
// One block: every thread checks its nodes c for tokens[c] == target[parents[c]] and records the lowest
// such c per parent (the CPU op's first match); thread 0 then walks from the root. path, path_len and
// bonus stay on the device. Where the CPU op raises (a parent index out of order, a path longer than
// max_depth + 1), this one cannot without a host sync: it ignores such parents and stops at a full path.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ddtree::cuda {

constexpr int kTreeAcceptMaxNodes = 8192;  // first-match table in shared memory (32 KB)

struct TreeAcceptArgs {
  const int64_t* tokens;   // [N]
  const int64_t* parents;  // [N]
  const int64_t* target;   // [N]
  int num_nodes;           // N
  int max_depth;
  int64_t* path;           // [max_depth + 1], padded with -1
  int64_t* path_len;       // 0-dim
  int64_t* bonus;          // 0-dim
};

cudaError_t TreeAccept(const TreeAcceptArgs& args, cudaStream_t stream);

}  // namespace ddtree::cuda
