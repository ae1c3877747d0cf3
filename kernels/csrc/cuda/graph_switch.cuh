// A switch inside a CUDA graph, picked on the device: the graph runs one of its branch bodies (or none), chosen by
// a 0-dim int64 on the device that an earlier node of the same graph wrote. It lets a captured decode step choose
// what to run next (auto budget: which truncation of the tree to verify) without a read back to the host.
//
// Needs CUDA 12.8 or newer (conditional nodes of type switch); the torch side (capture, the caching allocator's
// pools) is in binding.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ddtree::cuda {

// Sets the switch's value to *index, or to num_branches (no branch runs) when *index is outside
// [0, num_branches). Launched inside the capture, before the switch node.
cudaError_t SetGraphSwitch(cudaGraphConditionalHandle handle, const int64_t* index, int64_t num_branches,
                           cudaStream_t stream);

}  // namespace ddtree::cuda
