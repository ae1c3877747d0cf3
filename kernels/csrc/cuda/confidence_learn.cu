// The confidence update kernel (design: confidence_learn.cuh).
#include "common.cuh"
#include "confidence_learn.cuh"

namespace ddtree::cuda {
namespace {

constexpr int kMaxThreads = 1024;

__global__ void __launch_bounds__(kMaxThreads) confidence_learn_kernel(ConfidenceLearnArgs a) {
  extern __shared__ unsigned char s_on_path[];  // [N]
  const int n = a.tree.num_nodes;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s_on_path[i] = 0;
  __syncthreads();
  for (int m = threadIdx.x; m < a.path_size; m += blockDim.x) {
    const int64_t node = a.path[m];
    if (node >= 0 && node < n) s_on_path[node] = 1;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int cell = confidence_cell(a.tree, i);
    if (cell < 0) continue;
    const int parent = checked_parent(a.tree, i);
    if (parent >= 0 && s_on_path[parent]) {
      atomicAdd(a.predicted + cell, expf(a.tree.scores[i] - a.tree.scores[parent]));
    }
    if (s_on_path[i]) atomicAdd(a.realised + cell, 1.0f);
  }
}

}  // namespace

cudaError_t ConfidenceLearn(const ConfidenceLearnArgs& args, cudaStream_t stream) {
  const int n = args.tree.num_nodes;
  if (n < 1 || n > kBudgetMaxNodes || args.tree.num_depths < 1 || args.tree.num_classes < 1 || args.path_size < 0) {
    return cudaErrorInvalidValue;
  }
  const int threads = round_up(min(n, kMaxThreads), kWarpSize);
  confidence_learn_kernel<<<1, threads, static_cast<size_t>(n), stream>>>(args);
  return cudaGetLastError();
}

}  // namespace ddtree::cuda
