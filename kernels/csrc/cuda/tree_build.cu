// Best-first draft tree kernels (design: tree_build.cuh).
#include <algorithm>

#include "common.cuh"
#include "tree_build.cuh"

namespace ddtree::cuda {
namespace {

constexpr int kChunkThreads = 512;
constexpr int kMergeThreads = 1024;
constexpr int kSelectThreads = 512;
constexpr int kMinChunkLen = 4096;       // vocabulary entries per top-k block, at least
constexpr int kMaxChunkLen = 32768;      // ... and at most (128 KB of keys in shared memory)
constexpr int kMaxCandidates = 16384;    // chunks * k that the merge block holds (128 KB)
// Top-k blocks per launch, at most, when the vocabulary allows: 4 blocks of 512 threads fit an SM, so 512
// blocks are one wave on the H200's 132 SMs (528 slots). 15 rows x 40 chunks of 4096 would be 600 blocks:
// a second wave of 72 that costs nearly a whole block time more.
constexpr int kMaxChunkBlocks = 512;
constexpr int kRadixBins = 256;

// How the vocabulary of each reachable row is cut for the top-k stages.
struct TopKPlan {
  int num_rows;    // min(L, B): deeper rows are out of reach of B pops
  int k;           // min(B, V)
  int num_chunks;  // per row
  int chunk_len;
  int sort_len;    // k rounded up to a power of two
};

TopKPlan make_plan(int num_depths, int vocab, int budget) {
  TopKPlan plan{};
  plan.num_rows = std::min(num_depths, budget);
  plan.k = std::min(budget, vocab);
  if (plan.num_rows == 0 || plan.k == 0) return plan;
  const int max_chunks = std::max(1, kMaxCandidates / plan.k);
  const int one_wave = std::max(1, kMaxChunkBlocks / plan.num_rows);
  // At least ceil(V / kMaxChunkLen) chunks (the keys fit shared memory; TreeBuildMaxVocab keeps that within
  // max_chunks), else as many as one wave holds, chunks of kMinChunkLen at least.
  const int chunks = std::max(ceil_div(vocab, kMaxChunkLen),
                              std::min({max_chunks, one_wave, ceil_div(vocab, kMinChunkLen)}));
  plan.chunk_len = ceil_div(vocab, chunks);
  plan.num_chunks = ceil_div(vocab, plan.chunk_len);  // every chunk non-empty
  plan.sort_len = 1;
  while (plan.sort_len < plan.k) plan.sort_len *= 2;
  return plan;
}

struct Workspace {
  uint64_t* candidates;  // [rows, chunks, k] keys, unsorted, 0 where a chunk had fewer than k entries
  float* topk_logprobs;  // [rows, k]
  int32_t* topk_tokens;  // [rows, k]
};

Workspace carve(void* base, const TopKPlan& plan) {
  const size_t num_candidates = static_cast<size_t>(plan.num_rows) * plan.num_chunks * plan.k;
  const size_t num_topk = static_cast<size_t>(plan.num_rows) * plan.k;
  Workspace ws{};
  ws.candidates = static_cast<uint64_t*>(base);
  ws.topk_logprobs = reinterpret_cast<float*>(ws.candidates + num_candidates);
  ws.topk_tokens = reinterpret_cast<int32_t*>(ws.topk_logprobs + num_topk);
  return ws;
}

// Candidate order: logprob descending, then token ascending; the keys of distinct tokens are distinct.
__device__ __forceinline__ uint64_t candidate_key(uint32_t logprob_key, uint32_t token) {
  return (static_cast<uint64_t>(logprob_key) << 32) | (0xffffffffu - token);
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
    for (int base = 0; base < n; base += blockDim.x) {  // same trip count in every lane: match_any below
      const int i = base + threadIdx.x;
      uint32_t digit = kRadixBins;  // "no bucket"
      if (i < n) {
        const uint64_t key = key_at(i);
        if ((key & mask) == prefix) digit = static_cast<uint32_t>(key >> shift) & 0xffu;
      }
      if (__any_sync(kFullMask, digit < kRadixBins)) {  // later passes: most warps hold no key of the prefix
        const unsigned peers = __match_any_sync(kFullMask, digit);
        if (digit < kRadixBins && lane == __ffs(peers) - 1) atomicAdd(&s.hist[digit], __popc(peers));
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

// Block (chunk, row): the k best keys of vocab[chunk * chunk_len ...) of one row, in any order.
__global__ void __launch_bounds__(kChunkThreads)
    topk_chunk_kernel(const float* __restrict__ logprobs, int vocab, TopKPlan plan, uint64_t* __restrict__ out_all) {
  extern __shared__ uint32_t s_keys[];  // [chunk_len] float keys
  __shared__ RadixState s;
  const int row = blockIdx.y;
  const int begin = blockIdx.x * plan.chunk_len;
  const int n = min(plan.chunk_len, vocab - begin);
  const float* src = logprobs + static_cast<size_t>(row) * vocab + begin;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s_keys[i] = float_key(src[i]);
  if (threadIdx.x == 0) s.counter = 0;
  __syncthreads();

  const auto key_at = [&](int i) { return candidate_key(s_keys[i], static_cast<uint32_t>(begin + i)); };
  const int num_kept = min(plan.k, n);
  const uint64_t threshold = num_kept < n ? select_threshold(key_at, n, num_kept, s) : 0;  // keys are > 0
  uint64_t* out = out_all + (static_cast<size_t>(row) * plan.num_chunks + blockIdx.x) * plan.k;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const uint64_t key = key_at(i);
    if (key >= threshold) out[atomicAdd(&s.counter, 1u)] = key;
  }
  for (int i = num_kept + threadIdx.x; i < plan.k; i += blockDim.x) out[i] = 0;
}

// Block row: the k best of the row's chunk candidates, sorted, as (logprob, token) pairs.
__global__ void __launch_bounds__(kMergeThreads) topk_merge_kernel(const uint64_t* __restrict__ candidates,
                                                                   TopKPlan plan, float* __restrict__ topk_logprobs,
                                                                   int32_t* __restrict__ topk_tokens) {
  extern __shared__ uint64_t s_cand[];  // [num_chunks * k], then [sort_len]
  __shared__ RadixState s;
  const int num_cand = plan.num_chunks * plan.k;
  uint64_t* s_sorted = s_cand + num_cand;
  const uint64_t* src = candidates + static_cast<size_t>(blockIdx.x) * num_cand;
  for (int i = threadIdx.x; i < num_cand; i += blockDim.x) s_cand[i] = src[i];
  for (int i = plan.k + threadIdx.x; i < plan.sort_len; i += blockDim.x) s_sorted[i] = 0;
  if (threadIdx.x == 0) s.counter = 0;
  __syncthreads();

  // With one chunk the candidates are exactly the k best; otherwise the k-th best is a real key (> 0),
  // so the padding zeros fall below the threshold.
  const auto key_at = [&](int i) { return s_cand[i]; };
  const uint64_t threshold = plan.k < num_cand ? select_threshold(key_at, num_cand, plan.k, s) : 0;
  for (int i = threadIdx.x; i < num_cand; i += blockDim.x) {
    const uint64_t key = s_cand[i];
    if (key >= threshold) s_sorted[atomicAdd(&s.counter, 1u)] = key;
  }
  __syncthreads();

  // Bitonic sort, descending.
  for (int size = 2; size <= plan.sort_len; size <<= 1) {
    for (int stride = size / 2; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < plan.sort_len / 2; i += blockDim.x) {
        const int lo = 2 * stride * (i / stride) + i % stride;
        const int hi = lo + stride;
        const bool descending = (lo & size) == 0;
        const uint64_t a = s_sorted[lo];
        const uint64_t b = s_sorted[hi];
        if ((a < b) == descending) {
          s_sorted[lo] = b;
          s_sorted[hi] = a;
        }
      }
      __syncthreads();
    }
  }

  const size_t out = static_cast<size_t>(blockIdx.x) * plan.k;
  for (int r = threadIdx.x; r < plan.k; r += blockDim.x) {
    const uint64_t key = s_sorted[r];
    topk_logprobs[out + r] = key_float(static_cast<uint32_t>(key >> 32));
    topk_tokens[out + r] = static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(key));
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
  uint64_t* entry;  // [slots] frontier: entry[g] = next unpopped child of node g (0: none), g < budget
  float* score;     // [B+1]
  int* parent;      // [B+1]
  int* depth;       // [B+1]
  int* rank;        // [B+1]
  float* logprobs;  // [rows, k]
};

// Frontier slots: one per node that can still have a child popped after it (nodes 0 .. B-1), in groups of
// 32, at most 32 groups (B <= 1024).
__host__ __device__ constexpr int select_slots(int budget) { return round_up(budget > 0 ? budget : 1, kWarpSize); }

size_t select_smem_bytes(int budget, const TopKPlan& plan) {
  return static_cast<size_t>(select_slots(budget)) * sizeof(uint64_t) +
         static_cast<size_t>(budget + 1) * (sizeof(float) + 3 * sizeof(int)) +
         static_cast<size_t>(plan.num_rows) * plan.k * sizeof(float);
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
// two independent REDUX per pop, one shared-memory load round, all lanes on the same path (no branches).
__device__ int run_best_first(const SelectSmem& s, int budget, const TopKPlan& plan) {
  const int lane = threadIdx.x;
  const int k = plan.k;
  const int last_row = plan.num_rows - 1;
  uint64_t group_best = 0;
  if (lane == 0) {
    s.score[0] = 0.0f;
    s.parent[0] = -1;
    s.depth[0] = 0;
    s.rank[0] = 0;
    if (budget > 0 && k > 0) {
      group_best = heap_entry(0.0f + s.logprobs[0], 1, 0, 0);
      s.entry[0] = group_best;
    }
  }
  __syncwarp();
  uint64_t best = group_best;
  uint64_t unused = 0;
  warp_max_u64_pair(best, unused);
  int num_popped = 0;
  while (num_popped < budget && best != 0) {
    const uint32_t top_key = static_cast<uint32_t>(best >> 32);
    const uint32_t tie = ~static_cast<uint32_t>(best);
    const int depth = static_cast<int>(tie >> 21);
    const int rank = static_cast<int>((tie >> 11) & 1023u);
    const int parent = static_cast<int>(tie & 2047u);
    const float score = key_float(top_key);
    const int node = ++num_popped;
    const int group = parent / kWarpSize;
    const int slot = group * kWarpSize + lane;

    const uint64_t held = s.entry[slot];
    const float parent_score = s.score[parent];
    const float sibling_lp = s.logprobs[(depth - 1) * k + min(rank + 1, k - 1)];
    const float child_lp = s.logprobs[min(depth, last_row) * k];
    // The popped node's next sibling takes its slot; its first child goes to slot `node` (nodes >= budget
    // are never parents of a pop: the loop ends first). Both keys are computed, then kept or dropped, so
    // the four loads above issue together.
    const uint64_t sibling_key = heap_entry(parent_score + sibling_lp, depth, rank + 1, parent);
    const uint64_t child_key = heap_entry(score + child_lp, depth + 1, 0, node);
    const uint64_t sibling = rank + 1 < k ? sibling_key : 0;
    const uint64_t child = depth <= last_row && node < budget ? child_key : 0;
    if (lane == 0) {
      s.parent[node] = parent;
      s.depth[node] = depth;
      s.rank[node] = rank;
      s.score[node] = score;
    }
    // Each slot is stored by the lane that loaded it above (no cross-lane hazard within the pop).
    if (lane == parent % kWarpSize) s.entry[parent] = sibling;
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
  s.score = reinterpret_cast<float*>(s.entry + num_slots);
  s.parent = reinterpret_cast<int*>(s.score + num_nodes);
  s.depth = s.parent + num_nodes;
  s.rank = s.depth + num_nodes;
  s.logprobs = reinterpret_cast<float*>(s.rank + num_nodes);
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
  for (int n = threadIdx.x; n < num_nodes; n += blockDim.x) {
    bool* vis_row = out.visibility + static_cast<size_t>(n) * num_nodes;
    if (n >= 1 && n <= num_popped) {
      const int depth = s.depth[n];
      const int rank = s.rank[n];
      out.tokens[n] = args.topk_tokens[(depth - 1) * plan.k + rank];
      out.parents[n] = s.parent[n];
      out.depths[n] = depth;
      out.ranks[n] = rank;
      out.scores[n] = s.score[n];
      for (int j = n; j >= 0; j = s.parent[j]) vis_row[j] = true;
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
  return static_cast<int64_t>(std::max(1, kMaxCandidates / std::max(1, budget))) * kMaxChunkLen;
}

size_t TreeBuildWorkspaceBytes(int num_depths, int vocab, int budget) {
  const TopKPlan plan = make_plan(num_depths, vocab, budget);
  const size_t num_topk = static_cast<size_t>(plan.num_rows) * plan.k;
  return num_topk * plan.num_chunks * sizeof(uint64_t) + num_topk * (sizeof(float) + sizeof(int32_t));
}

cudaError_t TreeBuild(const TreeBuildArgs& args, cudaStream_t stream) {
  if (args.budget < 0 || args.budget > kTreeBuildMaxBudget || args.num_depths < 1 || args.vocab < 1 ||
      args.vocab > TreeBuildMaxVocab(args.budget) || std::min(args.num_depths, args.budget) > kTreeBuildMaxDepth) {
    return cudaErrorInvalidValue;
  }
  const TopKPlan plan = make_plan(args.num_depths, args.vocab, args.budget);
  const Workspace ws = carve(args.workspace, plan);
  if (plan.num_rows > 0 && plan.k > 0) {
    const size_t chunk_smem = static_cast<size_t>(plan.chunk_len) * sizeof(uint32_t);
    DDTREE_CUDA_TRY(allow_dynamic_smem(topk_chunk_kernel, chunk_smem));
    topk_chunk_kernel<<<dim3(plan.num_chunks, plan.num_rows), kChunkThreads, chunk_smem, stream>>>(
        args.draft_logprobs, args.vocab, plan, ws.candidates);
    DDTREE_CUDA_TRY(cudaGetLastError());

    const size_t merge_smem = (static_cast<size_t>(plan.num_chunks) * plan.k + plan.sort_len) * sizeof(uint64_t);
    DDTREE_CUDA_TRY(allow_dynamic_smem(topk_merge_kernel, merge_smem));
    topk_merge_kernel<<<plan.num_rows, kMergeThreads, merge_smem, stream>>>(ws.candidates, plan, ws.topk_logprobs,
                                                                           ws.topk_tokens);
    DDTREE_CUDA_TRY(cudaGetLastError());
  }
  const SelectArgs select{ws.topk_logprobs, ws.topk_tokens, plan, args.budget, args};
  const size_t select_smem = select_smem_bytes(args.budget, plan);
  DDTREE_CUDA_TRY(allow_dynamic_smem(tree_select_kernel, select_smem));
  tree_select_kernel<<<1, kSelectThreads, select_smem, stream>>>(select);
  return cudaGetLastError();
}

}  // namespace ddtree::cuda
