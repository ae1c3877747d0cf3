// The device side of a graph switch (design: graph_switch.cuh).
#include "graph_switch.cuh"

namespace ddtree::cuda {
namespace {

__global__ void set_graph_switch_kernel(cudaGraphConditionalHandle handle, const int64_t* index,
                                        int64_t num_branches) {
  const int64_t value = *index;
  cudaGraphSetConditional(handle, static_cast<unsigned>(value >= 0 && value < num_branches ? value : num_branches));
}

}  // namespace

cudaError_t SetGraphSwitch(cudaGraphConditionalHandle handle, const int64_t* index, int64_t num_branches,
                           cudaStream_t stream) {
  set_graph_switch_kernel<<<1, 1, 0, stream>>>(handle, index, num_branches);
  return cudaGetLastError();
}

}  // namespace ddtree::cuda
