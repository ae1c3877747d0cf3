// Greedy acceptance kernel (design: tree_accept.cuh).
#include <climits>

#include "common.cuh"
#include "tree_accept.cuh"

namespace ddtree::cuda {
namespace {

constexpr int kThreads = 1024;

__global__ void __launch_bounds__(kThreads) tree_accept_kernel(TreeAcceptArgs a) {
  extern __shared__ int s_first_match[];  // [N]: lowest child c of node p with tokens[c] == target[p]
  __shared__ int s_path_len;
  const int n = a.num_nodes;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s_first_match[i] = INT_MAX;
  __syncthreads();
  for (int c = 1 + threadIdx.x; c < n; c += blockDim.x) {
    const int64_t p = a.parents[c];
    if (p >= 0 && p < c && a.tokens[c] == a.target[p]) atomicMin(&s_first_match[p], c);
  }
  __syncthreads();

  const int path_size = a.max_depth + 1;
  if (threadIdx.x == 0) {
    int current = 0;
    int len = 1;
    a.path[0] = 0;
    while (len < path_size && s_first_match[current] != INT_MAX) {
      current = s_first_match[current];
      a.path[len++] = current;
    }
    *a.path_len = len;
    *a.bonus = a.target[current];
    s_path_len = len;
  }
  __syncthreads();
  for (int i = s_path_len + threadIdx.x; i < path_size; i += blockDim.x) a.path[i] = -1;
}

}  // namespace

cudaError_t TreeAccept(const TreeAcceptArgs& args, cudaStream_t stream) {
  if (args.num_nodes < 1 || args.num_nodes > kTreeAcceptMaxNodes || args.max_depth < 0) return cudaErrorInvalidValue;
  const size_t smem = static_cast<size_t>(args.num_nodes) * sizeof(int);
  tree_accept_kernel<<<1, kThreads, smem, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace ddtree::cuda
