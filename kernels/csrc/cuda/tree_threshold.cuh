// tree_build's threshold build: the best-first tree found by one block in parallel, no pop loop.
//
// When every top-k logprob is <= 0, a node's first child and next sibling score no higher than the node and
// come after it in the heap's order, so best-first pops the nodes in that order, and the B pops are the B
// first nodes of the whole (implicit) tree. So: take a score threshold t that at least B nodes reach, list
// every node with score >= t level by level (a node below t has no descendant above it), sort the list in
// the heap's order and keep the first B. The threshold starts at a score that B to 1.25 B of the nodes one
// rank off the rank-0 path reach (they are real nodes, so at least B reach it). Where a level would overflow
// the list, the threshold rises to the B-th best score in hand, the nodes below it go, and the level is
// redone. Exact ties of (score, depth, rank) are ordered by the parent's position, depth by depth, as the
// heap does. Returns -1 where it does not apply (a positive logprob) or gives up (kThresholdMaxRaises raises,
// or more nodes tied at the threshold than the list holds): the caller then runs the heap, which gives the
// same tree.
#pragma once

#include "block_select.cuh"
#include "common.cuh"
#include "tree_build.cuh"
#include "tree_heap.cuh"

namespace ddtree::cuda {

constexpr int kThresholdMaxRaises = 8;
constexpr int kThresholdRounds = 8;  // of the first threshold's search, 16 candidates each
constexpr int kThresholdThreads = 512;  // the select kernel's block
constexpr int kThresholdMaxNodes = 4096;
constexpr int kThresholdItems = kThresholdMaxNodes / kThresholdThreads;  // nodes per thread when compacting
static_assert(kThresholdItems <= kScanItems, "the block scan covers the node list");
static_assert(kThresholdThreads / kWarpSize <= kWarpSize, "one lane per warp in the first threshold's search");
constexpr int kMaxRunsPerThread = (kTreeBuildMaxBudget + kThresholdThreads - 1) / kThresholdThreads;
constexpr uint16_t kRootParent = 0xffff;
// Longer lists first drop the nodes that cannot reach a position below the budget (a radix select, about the
// cost of sorting 1024 keys); shorter ones are sorted whole.
constexpr int kSortWhole = 1024;

// Nodes the list holds: 4x the budget, at least 1024, a power of two (the sort's length).
__host__ __device__ constexpr int threshold_capacity(int budget) {
  int capacity = 1024;
  while (capacity < 4 * budget) capacity *= 2;
  return capacity;
}
static_assert(threshold_capacity(kTreeBuildMaxBudget) == kThresholdMaxNodes, "the largest list");

__host__ __device__ constexpr size_t threshold_smem_bytes(int budget, int num_rows) {
  const size_t capacity = threshold_capacity(budget);
  return capacity * (sizeof(uint64_t) + sizeof(int32_t) + sizeof(uint16_t)) + sizeof(int32_t) +
         num_rows * sizeof(float);
}

struct ThresholdSmem {
  uint64_t* keys;      // [capacity] node_key(...); while sorting, the node's list index in the low 16 bits
  int32_t* scratch;    // [capacity + 1] child counts then offsets; new indices; sorted positions
  uint16_t* parent;    // [capacity] list index of the node's parent (kRootParent at depth 1)
  float* path_scores;  // [rows] score of the rank-0 path's node at each depth (0 for the root)
};

struct ThresholdShared {
  RadixState radix;
  int warp_sums[kThresholdThreads / kWarpSize];
};

// A listed node: score key, then ~(depth, rank), so that descending keys follow the heap's order up to the
// parent; 16 low bits left for the list index.
__device__ __forceinline__ uint64_t node_key(float score, int depth, int rank) {
  const uint32_t order = ~((static_cast<uint32_t>(depth) << 10) | static_cast<uint32_t>(rank)) & 0xffffu;
  return (static_cast<uint64_t>(float_key(score)) << 32) | (static_cast<uint64_t>(order) << 16);
}
__device__ __forceinline__ float key_score(uint64_t key) { return key_float(static_cast<uint32_t>(key >> 32)); }
__device__ __forceinline__ int key_depth(uint64_t key) { return static_cast<int>((~key >> 26) & 63u); }
__device__ __forceinline__ int key_rank(uint64_t key) { return static_cast<int>((~key >> 16) & 1023u); }
__device__ __forceinline__ uint64_t with_index(uint64_t key, int index) { return key | (0xffffu - index); }
__device__ __forceinline__ int key_index(uint64_t key) { return 0xffff - static_cast<int>(key & 0xffffu); }
__device__ __forceinline__ bool same_order(uint64_t a, uint64_t b) { return (a >> 16) == (b >> 16); }

// How many of a node's children reach tau: its score plus the row's descending logprobs, a binary search.
__device__ __forceinline__ int children_reaching(float score, const float* row, int k, float tau) {
  int lo = 0;
  int hi = k;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (score + row[mid] >= tau) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// The largest f with offsets[f] <= j (offsets ascending from offsets[0] = 0): whose children slot j holds.
__device__ __forceinline__ int slot_owner(const int32_t* offsets, int num, int j) {
  int lo = 0;
  int hi = num - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (offsets[mid] <= j) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// The score of the budget-th best of n > budget keys (made distinct by their index).
template <typename KeyAt>
__device__ float budget_th_score(const KeyAt& key_at, int n, int budget, RadixState& radix) {
  const float tau = key_float(static_cast<uint32_t>(select_threshold(key_at, n, budget, radix) >> 32));
  return tau == tau ? tau : neg_inf();  // a partial radix prefix may decode to NaN
}

// The first threshold: a score that between B and 1.25 B (or as close as kThresholdRounds allow) of the nodes
// one rank off the rank-0 path reach, (d, r) = the rank-0 path to depth d, then rank r at depth d + 1. They
// are real nodes, so at least B nodes of the tree reach it. A search over the order-preserving keys, each
// warp counting for one candidate per round: lane d counts row d's nodes with a binary search.
__device__ inline float first_threshold(const float* lp, int num_rows, int k, int budget, const ThresholdSmem& t,
                                        ThresholdShared& sh) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;
  if (threadIdx.x == 0) {
    float score = 0.0f;
    for (int d = 0; d < num_rows; ++d) {
      t.path_scores[d] = score;
      score = score + lp[d * k];
    }
  }
  __syncthreads();
  if (num_rows * k <= budget) return neg_inf();
  const bool has_row = lane < num_rows;
  const float path_score = has_row ? t.path_scores[lane] : 0.0f;
  // All num_rows * k nodes reach lo; none reaches hi (above the best, the rank-0 node at depth 1).
  uint32_t lo = warp_min_u32(has_row ? float_key(path_score + lp[lane * k + k - 1]) : 0xffffffffu);
  uint32_t hi = float_key(lp[0]) + 1;
  int lo_count = num_rows * k;
  for (int round = 0; round < kThresholdRounds && hi - lo > 1 && lo_count > budget + budget / 4; ++round) {
    const uint32_t base = lo;
    const uint64_t span = hi - lo;
    const auto candidate = [&](int w) { return base + static_cast<uint32_t>(span * (w + 1) / (num_warps + 1)); };
    const float x = key_float(candidate(warp));
    const int total = warp_sum_i32(has_row ? children_reaching(path_score, lp + lane * k, k, x) : 0);
    if (lane == 0) sh.warp_sums[warp] = total;
    __syncthreads();
    // Candidates ascend with the warp, counts descend: the first one fewer than `budget` reach is the new hi,
    // the one before it the new lo.
    const int count = lane < num_warps ? sh.warp_sums[lane] : 0;
    const int first_below = __ffs(__ballot_sync(kFullMask, lane >= num_warps || count < budget)) - 1;
    const int last_reached = __shfl_sync(kFullMask, count, max(first_below - 1, 0));
    if (first_below < num_warps) hi = candidate(first_below);
    if (first_below > 0) {
      lo = candidate(first_below - 1);
      lo_count = last_reached;
    }
    __syncthreads();  // warp_sums is read before the next round writes it
  }
  return key_float(lo);
}

// Keeps the listed nodes [0, num_nodes) that reach tau, in order, parents re-pointed (a parent scores at
// least its child, so it stays). [begin, end) is the last level's range; both come back moved.
__device__ inline int drop_below(const ThresholdSmem& t, ThresholdShared& sh, int num_nodes, float tau, int& begin,
                                 int& end) {
  const auto kept = [&](int i) { return static_cast<int>(key_score(t.keys[i]) >= tau); };
  const int num_kept = block_exclusive_scan(num_nodes, kept, t.scratch, sh.warp_sums);  // scratch[i]: new index
  uint64_t keys[kThresholdItems];
  uint16_t parents[kThresholdItems];
  int to[kThresholdItems];
#pragma unroll
  for (int u = 0; u < kThresholdItems; ++u) {
    const int i = threadIdx.x + u * blockDim.x;
    to[u] = -1;
    if (i < num_nodes && t.scratch[i + 1] > t.scratch[i]) {
      keys[u] = t.keys[i];
      const uint16_t p = t.parent[i];
      parents[u] = p == kRootParent ? p : static_cast<uint16_t>(t.scratch[p]);
      to[u] = t.scratch[i];
    }
  }
  __syncthreads();
#pragma unroll
  for (int u = 0; u < kThresholdItems; ++u) {
    if (to[u] >= 0) {
      t.keys[to[u]] = keys[u];
      t.parent[to[u]] = parents[u];
    }
  }
  begin = t.scratch[begin];
  end = t.scratch[end];
  __syncthreads();
  return num_kept;
}

// Lists every node with score >= tau, level by level, raising tau where the list would overflow. Returns the
// list's length, or -1 where it gives up.
__device__ inline int list_nodes(const float* lp, int num_rows, int k, int budget, float tau, const ThresholdSmem& t,
                                 ThresholdShared& sh) {
  const int capacity = threshold_capacity(budget);
  int num_nodes = 0;
  int begin = 0;  // the last level: [begin, end)
  int end = 0;
  int num_raises = 0;
  for (int d = 0; d < num_rows && (d == 0 || end > begin); ++d) {  // level d + 1, the children of level d
    const float* row = lp + d * k;
    const auto parent_score = [&](int f) { return d == 0 ? 0.0f : key_score(t.keys[begin + f]); };
    for (;;) {
      const int num_parents = d == 0 ? 1 : end - begin;  // fewer after a raise
      const auto num_reaching = [&](int f) { return children_reaching(parent_score(f), row, k, tau); };
      const int num_children = block_exclusive_scan(num_parents, num_reaching, t.scratch, sh.warp_sums);
      const int room = capacity - num_nodes;
      for (int j = threadIdx.x; j < min(num_children, room); j += blockDim.x) {
        const int f = slot_owner(t.scratch, num_parents, j);
        const int r = j - t.scratch[f];
        t.keys[num_nodes + j] = node_key(parent_score(f) + row[r], d + 1, r);
        t.parent[num_nodes + j] = d == 0 ? kRootParent : static_cast<uint16_t>(begin + f);
      }
      __syncthreads();
      if (num_children <= room) {
        begin = num_nodes;
        end = num_nodes + num_children;
        num_nodes = end;
        break;
      }
      // Overflow: the list is full of real nodes, so at least `budget` reach its budget-th best score.
      if (++num_raises > kThresholdMaxRaises) return -1;
      const auto key_at = [&](int i) { return with_index(t.keys[i], i); };
      const float raised = budget_th_score(key_at, capacity, budget, sh.radix);
      if (!(raised > tau)) return -1;  // ties at tau fill the list: no threshold of this kind fits
      tau = raised;
      num_nodes = drop_below(t, sh, num_nodes, tau, begin, end);  // the partial level goes too
    }
  }
  return num_nodes;
}

// Keeps the list's keys that can take one of the first `budget` positions (budget < num_nodes), at the front
// of t.keys, and returns how many: the budget best, plus the rest of a run of equal (score, depth, rank) the budget-th
// best belongs to (the runs' order is settled later). A parent outranks its child, so it stays.
__device__ inline int keep_contenders(const ThresholdSmem& t, ThresholdShared& sh, int num_nodes, int budget) {
  const auto key_at = [&](int i) { return t.keys[i]; };
  const uint64_t cut = select_threshold(key_at, num_nodes, budget, sh.radix) >> 16;
  const auto contends = [&](int i) { return static_cast<int>((t.keys[i] >> 16) >= cut); };
  const int num_kept = block_exclusive_scan(num_nodes, contends, t.scratch, sh.warp_sums);
  uint64_t keys[kThresholdItems];
  int to[kThresholdItems];
#pragma unroll
  for (int u = 0; u < kThresholdItems; ++u) {
    const int i = threadIdx.x + u * blockDim.x;
    to[u] = i < num_nodes && t.scratch[i + 1] > t.scratch[i] ? t.scratch[i] : -1;
    if (to[u] >= 0) keys[u] = t.keys[i];
  }
  __syncthreads();
#pragma unroll
  for (int u = 0; u < kThresholdItems; ++u) {
    if (to[u] >= 0) t.keys[to[u]] = keys[u];
  }
  __syncthreads();
  return num_kept;
}

// Sorts the list's first `budget` positions in the heap's order: by key, then runs of equal (score, depth,
// rank) by the parent's position, shallowest runs first (their parents' positions are final by then).
// scratch[i] = position of list node i, for the nodes that can reach a position below `budget`.
__device__ inline void sort_list(const ThresholdSmem& t, ThresholdShared& sh, int num_nodes, int num_rows,
                                 int budget) {
  for (int i = threadIdx.x; i < num_nodes; i += blockDim.x) t.keys[i] = with_index(t.keys[i], i);
  __syncthreads();
  if (num_nodes > kSortWhole) num_nodes = keep_contenders(t, sh, num_nodes, budget);
  int padded = 1;
  while (padded < num_nodes) padded *= 2;
  for (int i = num_nodes + threadIdx.x; i < padded; i += blockDim.x) t.keys[i] = 0;
  __syncthreads();
  bitonic_sort_desc(t.keys, padded);
  bool tied = false;
  for (int p = threadIdx.x; p < num_nodes; p += blockDim.x) {
    t.scratch[key_index(t.keys[p])] = p;
    tied |= p > 0 && p <= budget && same_order(t.keys[p], t.keys[p - 1]);
  }
  if (!__syncthreads_or(tied)) return;
  // This thread's runs (those starting at its positions below the budget), found before any key moves.
  int run_begin[kMaxRunsPerThread];
  int run_end[kMaxRunsPerThread];
  int run_depth[kMaxRunsPerThread];
  int num_runs = 0;
  for (int p = threadIdx.x; p < budget; p += blockDim.x) {
    const uint64_t first = t.keys[p];
    if ((p > 0 && same_order(first, t.keys[p - 1])) || p + 1 == num_nodes || !same_order(first, t.keys[p + 1])) {
      continue;
    }
    int q = p + 2;
    while (q < num_nodes && same_order(first, t.keys[q])) ++q;
    run_begin[num_runs] = p;
    run_end[num_runs] = q;
    run_depth[num_runs] = key_depth(first);
    ++num_runs;
  }
  __syncthreads();
  const auto parent_position = [&](uint64_t key) { return t.scratch[t.parent[key_index(key)]]; };
  for (int depth = 2; depth <= num_rows; ++depth) {
    for (int r = 0; r < num_runs; ++r) {
      if (run_depth[r] != depth) continue;
      const int p = run_begin[r];
      const int q = run_end[r];
      for (int i = p + 1; i < q; ++i) {  // insertion sort by the parent's position
        const uint64_t key = t.keys[i];
        const int position = parent_position(key);
        int j = i;
        while (j > p && parent_position(t.keys[j - 1]) > position) {
          t.keys[j] = t.keys[j - 1];
          --j;
        }
        t.keys[j] = key;
      }
      for (int i = p; i < q; ++i) t.scratch[key_index(t.keys[i])] = i;
    }
    __syncthreads();
  }
}

// Every thread: fills popped[0, budget] and returns budget, or returns -1 (see the top of this file).
__device__ inline int threshold_build(const float* lp, int num_rows, int k, int budget, uint64_t* popped,
                                      const ThresholdSmem& t, ThresholdShared& sh) {
  bool positive = false;
  for (int d = threadIdx.x; d < num_rows; d += blockDim.x) positive |= lp[d * k] > 0.0f;
  if (budget == 0 || __syncthreads_or(positive)) return -1;
  const float tau = first_threshold(lp, num_rows, k, budget, t, sh);
  const int num_nodes = list_nodes(lp, num_rows, k, budget, tau, t, sh);
  if (num_nodes < budget) return -1;  // gave up (-1); fewer is impossible: at least `budget` reach tau
  sort_list(t, sh, num_nodes, num_rows, budget);
  for (int p = threadIdx.x; p <= budget; p += blockDim.x) {
    if (p == 0) {
      popped[0] = root_entry();
      continue;
    }
    const uint64_t key = t.keys[p - 1];
    const uint16_t parent = t.parent[key_index(key)];
    const int parent_node = parent == kRootParent ? 0 : t.scratch[parent] + 1;
    popped[p] = heap_entry(key_score(key), key_depth(key), key_rank(key), parent_node);
  }
  return budget;
}

}  // namespace ddtree::cuda
