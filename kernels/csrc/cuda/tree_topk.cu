// Top-k stages of tree_build (design: tree_build.cuh, interface: tree_topk.cuh).
#include <algorithm>

#include "block_select.cuh"
#include "common.cuh"
#include "tree_build.cuh"
#include "tree_topk.cuh"

namespace ddtree::cuda {
namespace {

constexpr int kTopKThreads = 256;
constexpr int kChunkLen = 4096;                               // vocabulary entries per top-k block
constexpr int kPerThread = kChunkLen / kTopKThreads;
constexpr int kBinShift = 21;                                 // bins: the float keys' top 11 bits
constexpr int kNumBins = 1 << (32 - kBinShift);
constexpr int kBinsPerThread = kNumBins / kTopKThreads;
// Keys in the threshold bin and above that the gather collects per row. A row with more (many equal
// logprobs, e.g. integers) has each block select its chunk's k best of them first: slower, same result.
constexpr int kMaxGathered = 16384;
constexpr int kSmemGathered = 4096;  // candidates the last block selects from in shared memory (else from L2)
static_assert(kSmemGathered >= kChunkLen, "a tie-heavy row's block holds its chunk's keys in the gather buffer");
size_t zeroed_bytes(const TopKPlan& plan) {
  return static_cast<size_t>(plan.num_rows) * (kNumBins + 2) * sizeof(uint32_t);  // a multiple of 8
}

struct Workspace {
  uint32_t* hist;          // [rows, kNumBins] keys per bin; zeroed with the two counters below
  uint32_t* num_gathered;  // [rows] candidates written so far
  uint32_t* num_done;      // [rows] blocks of the row past the gather
  uint64_t* candidates;    // [rows, max_gathered] keys of the threshold bin and above, unordered
  float* topk_logprobs;    // [rows, k]
  int32_t* topk_tokens;    // [rows, k]
};

Workspace carve(void* base, const TopKPlan& plan) {
  const size_t rows = plan.num_rows;
  Workspace ws{};
  ws.hist = static_cast<uint32_t*>(base);
  ws.num_gathered = ws.hist + rows * kNumBins;
  ws.num_done = ws.num_gathered + rows;
  ws.candidates = reinterpret_cast<uint64_t*>(ws.num_done + rows);
  ws.topk_logprobs = reinterpret_cast<float*>(ws.candidates + rows * plan.max_gathered);
  ws.topk_tokens = reinterpret_cast<int32_t*>(ws.topk_logprobs + rows * plan.k);
  return ws;
}

// Candidate order: logprob descending, then token ascending; the keys of distinct tokens are distinct.
__device__ __forceinline__ uint64_t candidate_key(uint32_t logprob_key, uint32_t token) {
  return (static_cast<uint64_t>(logprob_key) << 32) | (0xffffffffu - token);
}

// The float keys of this thread's entries of the block's chunk (0: past the end, below every key).
__device__ __forceinline__ void load_chunk_keys(const float* __restrict__ row, int vocab,
                                                uint32_t (&keys)[kPerThread]) {
  const int begin = blockIdx.x * kChunkLen + threadIdx.x;
  float values[kPerThread];
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int i = begin + j * kTopKThreads;
    values[j] = i < vocab ? row[i] : 0.0f;
  }
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) keys[j] = begin + j * kTopKThreads < vocab ? float_key(values[j]) : 0u;
}

// Block (chunk, row): counts the chunk's float keys per bin into the row's histogram.
__global__ void __launch_bounds__(kTopKThreads)
    topk_hist_kernel(const float* __restrict__ logprobs, int vocab, uint32_t* __restrict__ hist, uint8_t* clear,
                     size_t clear_bytes) {
  __shared__ uint32_t s_hist[kNumBins];
  let_dependents_launch();
  const int block = blockIdx.y * gridDim.x + blockIdx.x;
  fill_zero(clear, clear_bytes, block * kTopKThreads + threadIdx.x, gridDim.x * gridDim.y * kTopKThreads);
  for (int b = threadIdx.x; b < kNumBins; b += kTopKThreads) s_hist[b] = 0;
  uint32_t keys[kPerThread];
  load_chunk_keys(logprobs + static_cast<size_t>(blockIdx.y) * vocab, vocab, keys);
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    if (keys[j] != 0u) atomicAdd(&s_hist[keys[j] >> kBinShift], 1u);
  }
  __syncthreads();
  uint32_t* row_hist = hist + static_cast<size_t>(blockIdx.y) * kNumBins;
  for (int b = threadIdx.x; b < kNumBins; b += kTopKThreads) {
    if (s_hist[b] != 0u) atomicAdd(&row_hist[b], s_hist[b]);
  }
}

struct GatherState {
  RadixState radix;
  uint32_t warp_above[kTopKThreads / kWarpSize];  // keys in the bins of the warps above
  uint32_t threshold_bin;  // the bin holding the row's k-th largest key
  uint32_t num_ge;         // keys in that bin and above
  uint32_t num_above;      // keys above that bin
  uint32_t num_kept;       // keys of the chunk in shared memory (tie-heavy rows)
  uint32_t num_written;    // ... of which written to the row's candidates
  uint32_t base;           // where the block's keys go in the row's candidates
  bool last;               // this block is the row's last past the gather
  uint64_t gathered[kSmemGathered];
  uint64_t sorted[kTreeBuildMaxBudget];
};

// All threads: the bin holding the k-th largest key of the row, and how many keys lie in it and above.
__device__ void find_threshold_bin(const uint32_t* __restrict__ row_hist, int k, GatherState& s) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  uint32_t h[kBinsPerThread];
  uint32_t sum = 0;
#pragma unroll
  for (int b = 0; b < kBinsPerThread; ++b) {
    h[b] = __ldcg(&row_hist[threadIdx.x * kBinsPerThread + b]);
    sum += h[b];
  }
  uint32_t inclusive = sum;  // keys in this thread's bins and those of the lanes above it
#pragma unroll
  for (int offset = 1; offset < kWarpSize; offset <<= 1) {
    const uint32_t v = __shfl_down_sync(kFullMask, inclusive, offset);
    if (lane + offset < kWarpSize) inclusive += v;
  }
  if (lane == 0) s.warp_above[warp] = inclusive;  // the warp's total, for now
  __syncthreads();
  uint32_t warps_above = 0;
  for (int w = warp + 1; w < kTopKThreads / kWarpSize; ++w) warps_above += s.warp_above[w];
  inclusive += warps_above;
  const uint32_t remaining = k;
  uint32_t cum = inclusive - sum;
  if (cum < remaining && remaining <= inclusive) {
#pragma unroll
    for (int b = kBinsPerThread - 1; b >= 0; --b) {
      if (cum < remaining && cum + h[b] >= remaining) {
        s.threshold_bin = threadIdx.x * kBinsPerThread + b;
        s.num_ge = cum + h[b];
        s.num_above = cum;
      }
      cum += h[b];
    }
  }
  __syncthreads();
}

// The k best of the row's n distinct candidate keys, sorted descending, as (logprob, token) pairs. The k-th
// lies in the threshold bin, below the s.num_above keys of the bins above it.
template <typename KeyAt>
__device__ void select_and_sort(const KeyAt& key_at, int n, const TopKPlan& plan, GatherState& s,
                                float* __restrict__ topk_logprobs, int32_t* __restrict__ topk_tokens) {
  if (threadIdx.x == 0) s.radix.counter = 0;
  __syncthreads();
  const uint64_t bin_prefix = static_cast<uint64_t>(s.threshold_bin) << (32 + kBinShift);
  const uint64_t threshold =  // keys are > 0
      plan.k < n ? select_threshold(key_at, n, plan.k - s.num_above, s.radix, bin_prefix, 32 - kBinShift) : 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const uint64_t key = key_at(i);
    if (key >= threshold) s.sorted[atomicAdd(&s.radix.counter, 1u)] = key;
  }
  for (int i = plan.k + threadIdx.x; i < plan.sort_len; i += blockDim.x) s.sorted[i] = 0;
  __syncthreads();

  bitonic_sort_desc(s.sorted, plan.sort_len);
  for (int r = threadIdx.x; r < plan.k; r += blockDim.x) {
    const uint64_t key = s.sorted[r];
    topk_logprobs[r] = key_float(static_cast<uint32_t>(key >> 32));
    topk_tokens[r] = static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(key));
  }
}

// Block (chunk, row): collects the chunk's keys in the row's threshold bin and above; the row's last block
// then selects and sorts the row's k best among the collected keys. A row with more keys there than
// kMaxGathered (many equal logprobs) collects only each chunk's k best of them, selected by the block.
__global__ void __launch_bounds__(kTopKThreads)
    topk_gather_kernel(const float* __restrict__ logprobs, int vocab, TopKPlan plan, Workspace ws) {
  __shared__ GatherState s;
  const int row = blockIdx.y;
  const int lane = threadIdx.x % kWarpSize;
  const int begin = blockIdx.x * kChunkLen + threadIdx.x;
  uint32_t keys[kPerThread];
  load_chunk_keys(logprobs + static_cast<size_t>(row) * vocab, vocab, keys);  // from L2: the hist pass read them
  wait_for_previous_grid();  // the histogram
  let_dependents_launch();
  find_threshold_bin(ws.hist + static_cast<size_t>(row) * kNumBins, plan.k, s);
  const uint32_t threshold_bin = s.threshold_bin;
  const bool gather_all = s.num_ge <= static_cast<uint32_t>(kMaxGathered);  // the same in every block of the row
  uint64_t* candidates = ws.candidates + static_cast<size_t>(row) * plan.max_gathered;
  if (gather_all) {
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const bool keep = keys[j] != 0u && (keys[j] >> kBinShift) >= threshold_bin;
      const unsigned voters = __ballot_sync(kFullMask, keep);
      if (voters != 0u) {  // rare: at most num_ge keys of the row pass
        uint32_t base = 0;
        if (lane == __ffs(voters) - 1) base = atomicAdd(&ws.num_gathered[row], __popc(voters));
        base = __shfl_sync(kFullMask, base, __ffs(voters) - 1);
        const uint32_t slot = base + __popc(voters & ((1u << lane) - 1u));
        if (keep) candidates[slot] = candidate_key(keys[j], begin + j * kTopKThreads);
      }
    }
  } else {
    if (threadIdx.x == 0) {
      s.num_kept = 0;
      s.num_written = 0;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      if (keys[j] != 0u && (keys[j] >> kBinShift) >= threshold_bin) {
        s.gathered[atomicAdd(&s.num_kept, 1u)] = candidate_key(keys[j], begin + j * kTopKThreads);
      }
    }
    __syncthreads();
    const int num_kept = static_cast<int>(s.num_kept);
    const auto key_at = [&](int i) { return s.gathered[i]; };
    const uint64_t threshold = plan.k < num_kept ? select_threshold(key_at, num_kept, plan.k, s.radix) : 0;
    if (threadIdx.x == 0) {
      s.base = atomicAdd(&ws.num_gathered[row], static_cast<uint32_t>(min(plan.k, num_kept)));
    }
    __syncthreads();
    for (int i = threadIdx.x; i < num_kept; i += blockDim.x) {
      if (s.gathered[i] >= threshold) candidates[s.base + atomicAdd(&s.num_written, 1u)] = s.gathered[i];
    }
  }
  // The last block of the row to get here sees every block's candidates (fence, then count: the
  // threadFenceReduction pattern).
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) s.last = atomicAdd(&ws.num_done[row], 1u) == gridDim.x - 1;
  __syncthreads();
  if (!s.last) return;
  __threadfence();
  float* topk_logprobs = ws.topk_logprobs + static_cast<size_t>(row) * plan.k;
  int32_t* topk_tokens = ws.topk_tokens + static_cast<size_t>(row) * plan.k;
  const int n = static_cast<int>(__ldcg(&ws.num_gathered[row]));
  if (n <= kSmemGathered) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) s.gathered[i] = __ldcg(&candidates[i]);
    const auto key_at = [&](int i) { return s.gathered[i]; };
    select_and_sort(key_at, n, plan, s, topk_logprobs, topk_tokens);
  } else {
    const auto key_at = [&](int i) { return __ldcg(&candidates[i]); };
    select_and_sort(key_at, n, plan, s, topk_logprobs, topk_tokens);
  }
}

}  // namespace

TopKPlan MakeTopKPlan(int num_depths, int vocab, int budget) {
  TopKPlan plan{};
  plan.num_rows = std::min(num_depths, budget);
  plan.k = std::min(budget, vocab);
  plan.num_chunks = ceil_div(vocab, kChunkLen);
  plan.sort_len = 1;
  while (plan.sort_len < plan.k) plan.sort_len *= 2;
  plan.max_gathered = std::max(kMaxGathered, plan.num_chunks * plan.k);
  return plan;
}

size_t TopKWorkspaceBytes(const TopKPlan& plan) {
  const size_t rows = plan.num_rows;
  return zeroed_bytes(plan) + rows * plan.max_gathered * sizeof(uint64_t) +
         rows * plan.k * (sizeof(float) + sizeof(int32_t));
}

TopKResult TopKResultIn(void* workspace, const TopKPlan& plan) {
  const Workspace ws = carve(workspace, plan);
  return {ws.topk_logprobs, ws.topk_tokens};
}

int64_t TreeBuildMaxVocab(int budget) {
  // Bounds the tie-heavy rows' candidates (chunks * k per row, <= 131072) and so the workspace.
  return static_cast<int64_t>(std::max(1, 16384 / std::max(1, budget))) * 32768;
}

cudaError_t TopK(const float* logprobs, int vocab, const TopKPlan& plan, void* workspace, uint8_t* clear,
                 size_t clear_bytes, cudaStream_t stream) {
  const Workspace ws = carve(workspace, plan);
  DDTREE_CUDA_TRY(cudaMemsetAsync(ws.hist, 0, zeroed_bytes(plan), stream));
  const dim3 grid(plan.num_chunks, plan.num_rows);
  topk_hist_kernel<<<grid, kTopKThreads, 0, stream>>>(logprobs, vocab, ws.hist, clear, clear_bytes);
  DDTREE_CUDA_TRY(cudaGetLastError());
  return launch_dependent(topk_gather_kernel, grid, kTopKThreads, 0, stream, logprobs, vocab, plan, ws);
}

}  // namespace ddtree::cuda
