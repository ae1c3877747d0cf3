// The routed experts' rows' kernels (expert_rows.cuh has the contract and the layout).
#include <cuda_bf16.h>

#include "common.cuh"
#include "expert_rows.cuh"

namespace ddtree::cuda {
namespace {

constexpr int kOrderThreads = 1024;
constexpr int kCopyThreads = 128;
constexpr int kCombineThreads = 128;
constexpr int kCombineCols = 8;  // columns per combine thread

__device__ __forceinline__ int expert_of(const ExpertRowsArgs& a, int j) {
  const int64_t id = a.idx[j];
  return id < 0 || id > a.num_experts ? a.num_experts : static_cast<int>(id);
}

// counts (then each id's next free row) [E + 1] and the scan's warp totals [32] in dynamic shared memory.
__global__ void __launch_bounds__(kOrderThreads) expert_order_kernel(const ExpertRowsArgs a) {
  extern __shared__ int shared[];
  int* cursor = shared;                       // [E + 1]
  int* warp_sums = shared + a.num_experts + 1;  // [32]
  const int num_ids = a.num_experts + 1;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  for (int e = threadIdx.x; e < num_ids; e += blockDim.x) cursor[e] = 0;
  __syncthreads();
  for (int j = threadIdx.x; j < a.num_assignments; j += blockDim.x) atomicAdd(&cursor[expert_of(a, j)], 1);
  __syncthreads();
  // Exclusive scan of the counts: each thread a run of ids, the runs' sums scanned across the block.
  const int per_thread = ceil_div(num_ids, blockDim.x);
  const int lo = min(static_cast<int>(threadIdx.x) * per_thread, num_ids), hi = min(lo + per_thread, num_ids);
  int run = 0;
  for (int e = lo; e < hi; ++e) run += cursor[e];
  int before = run;
  for (int offset = 1; offset < kWarpSize; offset <<= 1) {
    const int other = __shfl_up_sync(kFullMask, before, offset);
    if (lane >= offset) before += other;
  }
  if (lane == kWarpSize - 1) warp_sums[warp] = before;
  __syncthreads();
  before -= run;
  for (int w = 0; w < warp; ++w) before += warp_sums[w];
  for (int e = lo; e < hi; ++e) {
    const int count = cursor[e];
    cursor[e] = before;
    before += count;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < a.num_experts; e += blockDim.x) a.group_ends[e] = cursor[e + 1];
  __syncthreads();  // group_ends read the first rows before the placement moves them
  if (warp != 0) return;
  for (int base = 0; base < a.num_assignments; base += kWarpSize) {
    const int j = base + lane;
    const bool active = j < a.num_assignments;
    const int e = active ? expert_of(a, j) : -1 - lane;  // an inactive lane matches no other
    const unsigned same = __match_any_sync(kFullMask, e);
    const int leader = __ffs(same) - 1;
    int first = 0;
    if (lane == leader && active) {
      first = cursor[e];
      cursor[e] = first + __popc(same);
    }
    first = __shfl_sync(kFullMask, first, leader);
    if (active) a.slots[j] = first + __popc(same & ((1u << lane) - 1u));
    __syncwarp();
  }
}

// Block j copies x[j / k] into rows[slots[j]], 16 bytes a thread where the rows allow it.
template <bool kVector>
__global__ void __launch_bounds__(kCopyThreads) expert_copy_kernel(const ExpertRowsArgs a) {
  const int j = blockIdx.x;
  const auto* src = static_cast<const uint8_t*>(a.x) + static_cast<int64_t>(j / a.top_k) * a.x_row_bytes;
  auto* dst = static_cast<uint8_t*>(a.rows) + a.slots[j] * a.row_bytes;
  if constexpr (kVector) {
    for (int i = threadIdx.x; i < a.row_bytes / 16; i += blockDim.x) {
      reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
    }
  } else {
    for (int i = threadIdx.x; i < a.row_bytes; i += blockDim.x) dst[i] = src[i];
  }
}

// Thread (token n, columns h0 .. h0 + 7): the token's k rows in rank order, in float32.
template <typename T>
__global__ void __launch_bounds__(kCombineThreads) expert_combine_kernel(const ExpertCombineArgs a) {
  const int n = blockIdx.x;
  const int h0 = (blockIdx.y * blockDim.x + threadIdx.x) * kCombineCols;
  if (h0 >= a.width) return;
  const int held = min(a.num_out_rows, max(a.group_ends[a.num_experts - 1], 0));
  const T* out = static_cast<const T*>(a.out);
  float acc[kCombineCols] = {};
  for (int r = 0; r < a.top_k; ++r) {
    const int64_t slot = a.slots[static_cast<int64_t>(n) * a.top_k + r];
    if (slot < 0 || slot >= held) continue;
    const float w = a.weights[static_cast<int64_t>(n) * a.top_k + r];
    const T* row = out + slot * a.out_row_stride + h0;
#pragma unroll
    for (int c = 0; c < kCombineCols; ++c) {
      if (h0 + c < a.width) acc[c] += w * to_float(row[c]);
    }
  }
  T* y = static_cast<T*>(a.y) + static_cast<int64_t>(n) * a.width + h0;
#pragma unroll
  for (int c = 0; c < kCombineCols; ++c) {
    if (h0 + c < a.width) y[c] = from_float<T>(acc[c]);
  }
}

}  // namespace

cudaError_t ExpertRows(const ExpertRowsArgs& a, cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(a.num_experts + 1 + kWarpSize) * sizeof(int);
  DDTREE_CUDA_TRY(allow_dynamic_smem(expert_order_kernel, smem));
  expert_order_kernel<<<1, kOrderThreads, smem, stream>>>(a);
  DDTREE_CUDA_TRY(cudaGetLastError());
  if (a.num_assignments == 0 || a.row_bytes == 0) return cudaSuccess;
  const bool vector = a.row_bytes % 16 == 0 && a.x_row_bytes % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && reinterpret_cast<uintptr_t>(a.rows) % 16 == 0;
  if (vector) {
    expert_copy_kernel<true><<<a.num_assignments, kCopyThreads, 0, stream>>>(a);
  } else {
    expert_copy_kernel<false><<<a.num_assignments, kCopyThreads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

cudaError_t ExpertCombine(const ExpertCombineArgs& a, cudaStream_t stream) {
  if (a.num_tokens == 0 || a.width == 0) return cudaSuccess;
  const dim3 grid(a.num_tokens, ceil_div(a.width, kCombineThreads * kCombineCols));  // a prefill's tokens in x
  if (a.bf16) {
    expert_combine_kernel<__nv_bfloat16><<<grid, kCombineThreads, 0, stream>>>(a);
  } else {
    expert_combine_kernel<float><<<grid, kCombineThreads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

}  // namespace ddtree::cuda
