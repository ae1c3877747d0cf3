// Best-first draft tree kernels (design: tree_build.cuh).
#include <algorithm>

#include "common.cuh"
#include "tree_build.cuh"

namespace ddtree::cuda {
namespace {

constexpr int kTopKThreads = 256;
constexpr int kSelectThreads = 512;
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
constexpr int kRadixBins = 256;
constexpr int kSelectUnroll = 8;  // keys in flight per thread in the radix select

// How the vocabulary of each reachable row is cut for the top-k stages.
struct TopKPlan {
  int num_rows;      // min(L, B): deeper rows are out of reach of B pops
  int k;             // min(B, V)
  int num_chunks;    // per row, kChunkLen entries each (the last one shorter)
  int sort_len;      // k rounded up to a power of two
  int max_gathered;  // candidates per row: kMaxGathered, or each chunk's k best in a tie-heavy row
};

TopKPlan make_plan(int num_depths, int vocab, int budget) {
  TopKPlan plan{};
  plan.num_rows = std::min(num_depths, budget);
  plan.k = std::min(budget, vocab);
  plan.num_chunks = ceil_div(vocab, kChunkLen);
  plan.sort_len = 1;
  while (plan.sort_len < plan.k) plan.sort_len *= 2;
  plan.max_gathered = std::max(kMaxGathered, plan.num_chunks * plan.k);
  return plan;
}

struct Workspace {
  uint32_t* hist;          // [rows, kNumBins] keys per bin; zeroed with the two counters below
  uint32_t* num_gathered;  // [rows] candidates written so far
  uint32_t* num_done;      // [rows] blocks of the row past the gather
  uint64_t* candidates;    // [rows, max_gathered] keys of the threshold bin and above, unordered
  float* topk_logprobs;    // [rows, k]
  int32_t* topk_tokens;    // [rows, k]
};

size_t zeroed_bytes(const TopKPlan& plan) {
  return static_cast<size_t>(plan.num_rows) * (kNumBins + 2) * sizeof(uint32_t);  // a multiple of 8
}

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
    topk_hist_kernel(const float* __restrict__ logprobs, int vocab, uint32_t* __restrict__ hist) {
  __shared__ uint32_t s_hist[kNumBins];
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

struct RadixState {
  uint32_t hist[kRadixBins];
  uint32_t digit;
  uint32_t remaining;     // how many of the k still lie in the chosen bucket and below
  uint32_t bucket_count;  // keys in the chosen bucket
  uint32_t counter;       // output slots handed out by the gather
};

// Warp 0: the bucket holding the `remaining`-th largest key, scanning the digits from 255 down.
__device__ void find_bucket(RadixState& s, uint32_t remaining) {
  const int lane = threadIdx.x;
  uint32_t h[8];
  uint32_t sum = 0;
#pragma unroll
  for (int d = 0; d < 8; ++d) {
    h[d] = s.hist[lane * 8 + d];
    sum += h[d];
  }
  uint32_t inclusive = sum;  // keys in the bins of this lane and the lanes above it
#pragma unroll
  for (int offset = 1; offset < kWarpSize; offset <<= 1) {
    const uint32_t v = __shfl_down_sync(kFullMask, inclusive, offset);
    if (lane + offset < kWarpSize) inclusive += v;
  }
  const uint32_t above = inclusive - sum;
  if (above < remaining && remaining <= inclusive) {
    uint32_t cum = above;
    bool found = false;
#pragma unroll
    for (int d = 7; d >= 0; --d) {
      if (!found && cum + h[d] >= remaining) {
        found = true;
        s.digit = lane * 8 + d;
        s.remaining = remaining - cum;
        s.bucket_count = h[d];
      }
      cum += h[d];
    }
  }
}

// The threshold T such that exactly k of the n keys are >= T (keys distinct, k < n, all threads call).
// MSB-first radix select, 8 bits per pass; it stops at the first pass whose chosen bucket is taken whole.
template <typename KeyAt>
__device__ uint64_t select_threshold(const KeyAt& key_at, int n, int k, RadixState& s) {
  const int lane = threadIdx.x % kWarpSize;
  uint64_t prefix = 0;
  uint64_t mask = 0;
  uint32_t remaining = k;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int d = threadIdx.x; d < kRadixBins; d += blockDim.x) s.hist[d] = 0;
    __syncthreads();
    // kSelectUnroll keys per thread loaded at once (they may come from L2), then counted; the same trip count
    // in every lane (match_any below).
    for (int base = 0; base < n; base += blockDim.x * kSelectUnroll) {
      uint64_t keys[kSelectUnroll];
#pragma unroll
      for (int u = 0; u < kSelectUnroll; ++u) {
        const int i = base + u * blockDim.x + threadIdx.x;
        keys[u] = i < n ? key_at(i) : 0;
      }
#pragma unroll
      for (int u = 0; u < kSelectUnroll; ++u) {
        uint32_t digit = kRadixBins;  // "no bucket"
        if (base + u * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x) < n && (keys[u] & mask) == prefix) {
          digit = static_cast<uint32_t>(keys[u] >> shift) & 0xffu;
        }
        if (__any_sync(kFullMask, digit < kRadixBins)) {  // later passes: most warps hold no key of the prefix
          const unsigned peers = __match_any_sync(kFullMask, digit);
          if (digit < kRadixBins && lane == __ffs(peers) - 1) atomicAdd(&s.hist[digit], __popc(peers));
        }
      }
    }
    __syncthreads();
    if (threadIdx.x < kWarpSize) find_bucket(s, remaining);
    __syncthreads();
    prefix |= static_cast<uint64_t>(s.digit) << shift;
    mask |= static_cast<uint64_t>(0xffu) << shift;
    remaining = s.remaining;
    const bool done = s.bucket_count == remaining;
    __syncthreads();  // everyone has read s before the next pass rewrites it
    if (done) break;
  }
  return prefix;
}

struct GatherState {
  RadixState radix;
  uint32_t warp_above[kTopKThreads / kWarpSize];  // keys in the bins of the warps above
  uint32_t threshold_bin;  // the bin holding the row's k-th largest key
  uint32_t num_ge;         // keys in that bin and above
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
      }
      cum += h[b];
    }
  }
  __syncthreads();
}

// The k best of n distinct keys, sorted descending, as (logprob, token) pairs.
template <typename KeyAt>
__device__ void select_and_sort(const KeyAt& key_at, int n, const TopKPlan& plan, GatherState& s,
                                float* __restrict__ topk_logprobs, int32_t* __restrict__ topk_tokens) {
  if (threadIdx.x == 0) s.radix.counter = 0;
  __syncthreads();
  const uint64_t threshold = plan.k < n ? select_threshold(key_at, n, plan.k, s.radix) : 0;  // keys are > 0
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const uint64_t key = key_at(i);
    if (key >= threshold) s.sorted[atomicAdd(&s.radix.counter, 1u)] = key;
  }
  for (int i = plan.k + threadIdx.x; i < plan.sort_len; i += blockDim.x) s.sorted[i] = 0;
  __syncthreads();

  // Bitonic sort, descending.
  for (int size = 2; size <= plan.sort_len; size <<= 1) {
    for (int stride = size / 2; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < plan.sort_len / 2; i += blockDim.x) {
        const int lo = 2 * stride * (i / stride) + i % stride;
        const int hi = lo + stride;
        const bool descending = (lo & size) == 0;
        const uint64_t a = s.sorted[lo];
        const uint64_t b = s.sorted[hi];
        if ((a < b) == descending) {
          s.sorted[lo] = b;
          s.sorted[hi] = a;
        }
      }
      __syncthreads();
    }
  }
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

// Heap entry of a candidate node: higher score first, then lower depth, rank, parent (the CPU op's order).
// 6 + 10 + 11 bits of tie break: depth <= 32, rank < 1024, parent <= 1024.
__device__ __forceinline__ uint64_t heap_entry(float score, int depth, int rank, int parent) {
  const uint32_t tie = (static_cast<uint32_t>(depth) << 21) | (static_cast<uint32_t>(rank) << 11) |
                       static_cast<uint32_t>(parent);
  return (static_cast<uint64_t>(float_key(score)) << 32) | static_cast<uint32_t>(~tie);
}

struct SelectArgs {
  const float* topk_logprobs;  // [rows, k]
  const int32_t* topk_tokens;  // [rows, k]
  TopKPlan plan;
  int budget;
  TreeBuildArgs out;
};

struct SelectSmem {
  uint64_t* entry;   // [slots] frontier: entry[g] = next unpopped child of node g (0: none), g < budget
  uint64_t* popped;  // [B+1] the heap entry each node was popped as (node 0: score 0)
  float* logprobs;   // [rows, k]
};

// Frontier slots: one per node that can still have a child popped after it (nodes 0 .. B-1), in groups of
// 32, at most 32 groups (B <= 1024).
__host__ __device__ constexpr int select_slots(int budget) { return round_up(budget > 0 ? budget : 1, kWarpSize); }

size_t select_smem_bytes(int budget, const TopKPlan& plan) {
  return static_cast<size_t>(select_slots(budget) + budget + 1) * sizeof(uint64_t) +
         static_cast<size_t>(plan.num_rows) * plan.k * sizeof(float);
}

__device__ __forceinline__ float entry_score(uint64_t entry) { return key_float(static_cast<uint32_t>(entry >> 32)); }

// `value` if `keep`, else 0, without a branch.
__device__ __forceinline__ uint64_t keep_if(bool keep, uint64_t value) {
  return value & (0ull - static_cast<uint64_t>(keep));
}

// Warp-wide max of two 64-bit keys at once: the two halves' reductions overlap.
__device__ __forceinline__ void warp_max_u64_pair(uint64_t& a, uint64_t& b) {
  const uint32_t a_hi = warp_max_u32(static_cast<uint32_t>(a >> 32));
  const uint32_t b_hi = warp_max_u32(static_cast<uint32_t>(b >> 32));
  const uint32_t a_lo = warp_max_u32(static_cast<uint32_t>(a >> 32) == a_hi ? static_cast<uint32_t>(a) : 0u);
  const uint32_t b_lo = warp_max_u32(static_cast<uint32_t>(b >> 32) == b_hi ? static_cast<uint32_t>(b) : 0u);
  a = (static_cast<uint64_t>(a_hi) << 32) | a_lo;
  b = (static_cast<uint64_t>(b_hi) << 32) | b_lo;
}

// Warp 0 pops the heap. The frontier holds one entry per popped node (its next unpopped child) plus the
// root's, in slots grouped by 32 (slot g = node g); lane l keeps the best entry of group l in a register.
// A pop changes one group (the popped entry's slot gets the popped node's next sibling) and adds the new
// node's first child to its group, so the next best is one warp-wide max over (the other groups' bests,
// the changed group's 32 entries), computed together with the changed group's new best: two rounds of
// two independent REDUX per pop, one shared-memory load round, all lanes on the same path. One warp of
// mostly dependent instructions: the loop is issue-bound, so every instruction counts.
__device__ int run_best_first(const SelectSmem& s, int budget, const TopKPlan& plan) {
  const int lane = threadIdx.x;
  const int k = plan.k;
  const int last_row = plan.num_rows - 1;
  const float* lp = s.logprobs;
  uint64_t group_best = 0;
  if (lane == 0) {
    s.popped[0] = static_cast<uint64_t>(float_key(0.0f)) << 32;
    if (budget > 0 && k > 0) {
      group_best = heap_entry(0.0f + lp[0], 1, 0, 0);
      s.entry[0] = group_best;
    }
  }
  __syncwarp();
  uint64_t best = group_best;
  uint64_t unused = 0;
  warp_max_u64_pair(best, unused);
  int num_popped = 0;
  while (num_popped < budget && best != 0) {
    const uint32_t tie = ~static_cast<uint32_t>(best);
    const int depth = static_cast<int>(tie >> 21);
    const int rank = static_cast<int>((tie >> 11) & 1023u);
    const int parent = static_cast<int>(tie & 2047u);
    const float score = entry_score(best);
    const int node = ++num_popped;
    const int group = parent / kWarpSize;
    const int slot = group * kWarpSize + lane;

    const uint64_t held = s.entry[slot];
    const float parent_score = entry_score(s.popped[parent]);
    const float sibling_lp = lp[(depth - 1) * k + min(rank + 1, k - 1)];
    const float child_lp = lp[min(depth, last_row) * k];
    // The popped node's next sibling takes its slot; its first child goes to slot `node` (nodes >= budget
    // are never parents of a pop: the loop ends first). Both keys are computed, then kept or dropped, so
    // the loads above issue together.
    const uint64_t sibling = keep_if(rank + 1 < k, heap_entry(parent_score + sibling_lp, depth, rank + 1, parent));
    const uint64_t child =
        keep_if(depth <= last_row && node < budget, heap_entry(score + child_lp, depth + 1, 0, node));
    if (lane == 0) s.popped[node] = best;
    // Each slot is stored by the lane that loaded it above (no cross-lane hazard within the pop).
    if (slot == parent) s.entry[parent] = sibling;
    if (lane == node % kWarpSize && node < budget) s.entry[node] = child;
    const uint64_t changed = slot == parent ? sibling : (slot == node ? child : held);  // [32] the changed group
    if (lane == node / kWarpSize && lane != group) group_best = max(group_best, child);
    uint64_t next = max(lane == group ? 0 : group_best, changed);
    uint64_t changed_best = changed;
    warp_max_u64_pair(next, changed_best);
    if (lane == group) group_best = changed_best;
    best = next;
    __syncwarp();  // this pop's stores are seen by the next pop's loads
  }
  return num_popped;
}

// One block: the pops, the node arrays and the visibility matrix.
__global__ void __launch_bounds__(kSelectThreads) tree_select_kernel(SelectArgs args) {
  extern __shared__ uint64_t smem[];
  __shared__ int s_num_popped;
  const int num_nodes = args.budget + 1;
  const TopKPlan plan = args.plan;
  SelectSmem s;
  const int num_slots = select_slots(args.budget);
  s.entry = smem;
  s.popped = s.entry + num_slots;
  s.logprobs = reinterpret_cast<float*>(s.popped + num_nodes);
  for (int i = threadIdx.x; i < plan.num_rows * plan.k; i += blockDim.x) s.logprobs[i] = args.topk_logprobs[i];
  for (int i = threadIdx.x; i < num_slots; i += blockDim.x) s.entry[i] = 0;
  __syncthreads();

  const TreeBuildArgs& out = args.out;
  if (threadIdx.x < kWarpSize) {
    const int num_popped = run_best_first(s, args.budget, plan);
    if (threadIdx.x == 0) s_num_popped = num_popped;
  } else {
    fill_zero(reinterpret_cast<uint8_t*>(out.visibility), static_cast<size_t>(num_nodes) * num_nodes,
              threadIdx.x - kWarpSize, blockDim.x - kWarpSize);
  }
  __syncthreads();

  const int num_popped = s_num_popped;
  const int64_t root = *out.root_token;
  const auto parent_of = [&](int n) { return static_cast<int>(~static_cast<uint32_t>(s.popped[n]) & 2047u); };
  for (int n = threadIdx.x; n < num_nodes; n += blockDim.x) {
    bool* vis_row = out.visibility + static_cast<size_t>(n) * num_nodes;
    if (n >= 1 && n <= num_popped) {
      const uint64_t entry = s.popped[n];
      const uint32_t tie = ~static_cast<uint32_t>(entry);
      const int depth = static_cast<int>(tie >> 21);
      const int rank = static_cast<int>((tie >> 11) & 1023u);
      out.tokens[n] = args.topk_tokens[(depth - 1) * plan.k + rank];
      out.parents[n] = parent_of(n);
      out.depths[n] = depth;
      out.ranks[n] = rank;
      out.scores[n] = entry_score(entry);
      vis_row[0] = true;
      for (int j = n; j > 0; j = parent_of(j)) vis_row[j] = true;
    } else {  // the root, or padding after the heap ran dry
      out.tokens[n] = root;
      out.parents[n] = -1;
      out.depths[n] = 0;
      out.ranks[n] = 0;
      out.scores[n] = n == 0 ? 0.0f : -__int_as_float(0x7f800000);
      vis_row[n] = true;
    }
  }
}

}  // namespace

int64_t TreeBuildMaxVocab(int budget) {
  // Bounds the tie-heavy rows' candidates (chunks * k per row, <= 131072) and so the workspace.
  return static_cast<int64_t>(std::max(1, 16384 / std::max(1, budget))) * 32768;
}

size_t TreeBuildWorkspaceBytes(int num_depths, int vocab, int budget) {
  const TopKPlan plan = make_plan(num_depths, vocab, budget);
  const size_t rows = plan.num_rows;
  return zeroed_bytes(plan) + rows * plan.max_gathered * sizeof(uint64_t) +
         rows * plan.k * (sizeof(float) + sizeof(int32_t));
}

cudaError_t TreeBuild(const TreeBuildArgs& args, cudaStream_t stream) {
  if (args.budget < 0 || args.budget > kTreeBuildMaxBudget || args.num_depths < 1 || args.vocab < 1 ||
      args.vocab > TreeBuildMaxVocab(args.budget) || std::min(args.num_depths, args.budget) > kTreeBuildMaxDepth) {
    return cudaErrorInvalidValue;
  }
  const TopKPlan plan = make_plan(args.num_depths, args.vocab, args.budget);
  const Workspace ws = carve(args.workspace, plan);
  if (plan.num_rows > 0 && plan.k > 0) {
    DDTREE_CUDA_TRY(cudaMemsetAsync(ws.hist, 0, zeroed_bytes(plan), stream));
    const dim3 grid(plan.num_chunks, plan.num_rows);
    topk_hist_kernel<<<grid, kTopKThreads, 0, stream>>>(args.draft_logprobs, args.vocab, ws.hist);
    DDTREE_CUDA_TRY(cudaGetLastError());
    topk_gather_kernel<<<grid, kTopKThreads, 0, stream>>>(args.draft_logprobs, args.vocab, plan, ws);
    DDTREE_CUDA_TRY(cudaGetLastError());
  }
  const SelectArgs select{ws.topk_logprobs, ws.topk_tokens, plan, args.budget, args};
  const size_t select_smem = select_smem_bytes(args.budget, plan);
  DDTREE_CUDA_TRY(allow_dynamic_smem(tree_select_kernel, select_smem));
  tree_select_kernel<<<1, kSelectThreads, select_smem, stream>>>(select);
  return cudaGetLastError();
}

}  // namespace ddtree::cuda
