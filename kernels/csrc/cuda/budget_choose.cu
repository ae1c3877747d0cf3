// The budget policy's choice kernel (design: budget_choose.cuh).
#include "budget_choose.cuh"
#include "common.cuh"

namespace ddtree::cuda {
namespace {

constexpr int kMaxThreads = 1024;

// Inclusive prefix sum over the block of one value per thread. `warp_totals` holds blockDim.x / 32 floats; the
// caller syncs before the next call reuses it.
__device__ float block_inclusive_sum(float v, float* warp_totals) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;
  for (int offset = 1; offset < kWarpSize; offset <<= 1) {
    const float other = __shfl_up_sync(kFullMask, v, offset);
    if (lane >= offset) v += other;
  }
  if (lane == kWarpSize - 1) warp_totals[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float total = lane < num_warps ? warp_totals[lane] : 0.0f;
    for (int offset = 1; offset < kWarpSize; offset <<= 1) {
      const float other = __shfl_up_sync(kFullMask, total, offset);
      if (lane >= offset) total += other;
    }
    if (lane < num_warps) warp_totals[lane] = total;
  }
  __syncthreads();
  return warp > 0 ? v + warp_totals[warp - 1] : v;
}

__global__ void __launch_bounds__(kMaxThreads) budget_choose_kernel(BudgetChooseArgs a) {
  extern __shared__ float s_mem[];
  const int n = a.tree.num_nodes;
  float* s_own = s_mem;                                               // [N] factor at the node's cell (0: none)
  float* s_accept = s_mem + n;                                        // [N] p_i, then p_0 + ... + p_i
  int* s_parent = reinterpret_cast<int*>(s_mem + 2 * n);              // [N]
  __shared__ float s_warp_totals[kMaxThreads / kWarpSize];

  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int cell = confidence_cell(a.tree, i);
    s_own[i] = cell < 0 ? 0.0f : logf(a.realised[cell] / a.predicted[cell]);
    s_parent[i] = checked_parent(a.tree, i);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    float path = 0.0f;  // the node's own factor, then its ancestors' (the CPU op's order)
    for (int j = i; j != -1; j = s_parent[j]) path += s_own[j];
    const float accept = expf(a.tree.scores[i] + path);
    s_accept[i] = accept > 1.0f ? 1.0f : accept;  // the cap keeps NaN
  }
  __syncthreads();
  float carry = 0.0f;
  for (int base = 0; base < n; base += blockDim.x) {
    const int i = base + threadIdx.x;
    const float sum = block_inclusive_sum(i < n ? s_accept[i] : 0.0f, s_warp_totals) + carry;
    if (i < n) s_accept[i] = sum;
    __syncthreads();
    carry = s_accept[min(base + static_cast<int>(blockDim.x), n) - 1];
  }

  for (int k = threadIdx.x; k < a.num_buckets; k += blockDim.x) {
    const int64_t bucket = a.buckets[k];
    const float expected = s_accept[bucket < 0 ? 0 : (bucket < n ? bucket : n - 1)] - 1.0f;
    a.expected[k] = expected;
    a.value[k] = (1.0f + expected) / a.seconds[k];
  }
  __syncthreads();  // the block's global writes are visible to thread 0 past the barrier
  if (threadIdx.x == 0) {
    int best = -1;
    float best_value = 0.0f;
    for (int k = 0; k < a.num_buckets; ++k) {
      const float v = a.value[k];
      if (!isnan(v) && (best < 0 || v > best_value)) {
        best = k;
        best_value = v;
      }
    }
    *a.chosen = best < 0 ? 0 : best;
  }
}

}  // namespace

cudaError_t BudgetChoose(const BudgetChooseArgs& args, cudaStream_t stream) {
  const int n = args.tree.num_nodes;
  if (n < 1 || n > kBudgetMaxNodes || args.tree.num_depths < 1 || args.tree.num_classes < 1 || args.num_buckets < 1) {
    return cudaErrorInvalidValue;
  }
  const int threads = round_up(min(n, kMaxThreads), kWarpSize);
  const size_t smem = static_cast<size_t>(n) * (2 * sizeof(float) + sizeof(int));
  budget_choose_kernel<<<1, threads, smem, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace ddtree::cuda
