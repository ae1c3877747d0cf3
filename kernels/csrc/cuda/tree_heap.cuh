// tree_build's heap order and its serial best-first pops (design: tree_build.cuh).
#pragma once

#include "common.cuh"

namespace ddtree::cuda {

// Heap entry of a candidate node: higher score first, then lower depth, rank, parent (the CPU op's order).
// 6 + 10 + 11 bits of tie break: depth <= 32, rank < 1024, parent <= 1024.
__device__ __forceinline__ uint64_t heap_entry(float score, int depth, int rank, int parent) {
  const uint32_t tie = (static_cast<uint32_t>(depth) << 21) | (static_cast<uint32_t>(rank) << 11) |
                       static_cast<uint32_t>(parent);
  return (static_cast<uint64_t>(float_key(score)) << 32) | static_cast<uint32_t>(~tie);
}

__device__ __forceinline__ float entry_score(uint64_t entry) { return key_float(static_cast<uint32_t>(entry >> 32)); }
__device__ __forceinline__ uint32_t entry_tie(uint64_t entry) { return ~static_cast<uint32_t>(entry); }
__device__ __forceinline__ int entry_depth(uint64_t entry) { return static_cast<int>(entry_tie(entry) >> 21); }
__device__ __forceinline__ int entry_rank(uint64_t entry) { return static_cast<int>((entry_tie(entry) >> 11) & 1023u); }
__device__ __forceinline__ int entry_parent(uint64_t entry) { return static_cast<int>(entry_tie(entry) & 2047u); }
// The root's entry: score 0.
__device__ __forceinline__ uint64_t root_entry() { return static_cast<uint64_t>(float_key(0.0f)) << 32; }

// The heap's frontier and the popped nodes, in shared memory.
struct HeapSmem {
  uint64_t* entry;   // [heap_slots(B)] entry[g] = next unpopped child of node g (0: none), g < budget; zeroed
  uint64_t* popped;  // [B+1] the heap entry each node was popped as
};

// Frontier slots: one per node that can still have a child popped after it (nodes 0 .. B-1), in groups of
// 32, at most 32 groups (B <= 1024).
__host__ __device__ constexpr int heap_slots(int budget) { return round_up(budget > 0 ? budget : 1, kWarpSize); }

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
__device__ inline int run_best_first(const HeapSmem& s, const float* lp, int num_rows, int k, int budget) {
  const int lane = threadIdx.x;
  const int last_row = num_rows - 1;
  uint64_t group_best = 0;
  if (lane == 0) {
    s.popped[0] = root_entry();
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
    const int depth = entry_depth(best);
    const int rank = entry_rank(best);
    const int parent = entry_parent(best);
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

}  // namespace ddtree::cuda
