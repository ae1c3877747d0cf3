// A step's commit in one launch (contract: kernels/ops.py): generated[n + i] = target[path[i]] for i < path_len,
// then num_generated += path_len, prefix_len += path_len, root = bonus, every value read on the device.
//
// One warp: each thread reads num_generated and path_len, writes its slots, and after a barrier thread 0 moves the
// counters, so no thread reads an updated one. Where the CPU op raises (path_len outside [1, P], a path entry
// outside [0, N) before path_len, num_generated < 0), this one cannot without a host sync: it clamps path_len into
// [0, P], skips an entry outside [0, N) and writes nothing to a slot outside [0, G); the counters still move by the
// clamped path_len.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ddtree::cuda {

struct CommitPathArgs {
  const int64_t* target;    // [N] at target_stride
  int64_t target_stride;
  int64_t num_nodes;        // N
  const int64_t* path;      // [P] at path_stride, padded with -1
  int64_t path_stride;
  int64_t path_size;        // P
  const int64_t* path_len;  // 0-dim
  const int64_t* bonus;     // 0-dim
  int64_t* generated;       // [G], contiguous
  int64_t num_slots;        // G
  int64_t* num_generated;   // 0-dim
  int64_t* root;            // 0-dim
  int64_t* prefix_len;      // 0-dim
};

cudaError_t CommitPath(const CommitPathArgs& args, cudaStream_t stream);

}  // namespace ddtree::cuda
