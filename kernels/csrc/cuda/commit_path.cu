// A step's commit kernel (design: commit_path.cuh).
#include "commit_path.cuh"
#include "common.cuh"

namespace ddtree::cuda {
namespace {

constexpr int kThreads = kWarpSize;  // a path holds L + 1 <= 33 nodes in practice; the loop takes any P

__global__ void __launch_bounds__(kThreads) commit_path_kernel(CommitPathArgs a) {
  const int64_t start = *a.num_generated;
  const int64_t len = min(max(*a.path_len, int64_t{0}), a.path_size);
  for (int64_t i = threadIdx.x; i < len; i += blockDim.x) {
    const int64_t node = a.path[i * a.path_stride];
    const int64_t slot = start + i;
    if (node >= 0 && node < a.num_nodes && slot >= 0 && slot < a.num_slots) {
      a.generated[slot] = a.target[node * a.target_stride];
    }
  }
  __syncthreads();  // every thread has read num_generated before thread 0 moves it
  if (threadIdx.x == 0) {
    *a.num_generated = start + len;
    *a.prefix_len += len;
    *a.root = *a.bonus;
  }
}

}  // namespace

cudaError_t CommitPath(const CommitPathArgs& args, cudaStream_t stream) {
  if (args.num_nodes < 0 || args.path_size < 1 || args.num_slots < 0) return cudaErrorInvalidValue;
  commit_path_kernel<<<1, kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace ddtree::cuda
