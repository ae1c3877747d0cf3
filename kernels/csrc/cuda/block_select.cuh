// Block-wide selection and sorting of 64-bit keys in shared memory (or wherever key_at reads them), shared by
// tree_build's top-k and its threshold build. Every thread of the block calls these functions.
#pragma once

#include "common.cuh"

namespace ddtree::cuda {

constexpr int kRadixBins = 256;
constexpr int kSelectUnroll = 8;  // keys in flight per thread in the radix select

struct RadixState {
  uint32_t hist[kRadixBins];
  uint32_t digit;
  uint32_t remaining;     // how many of the k still lie in the chosen bucket and below
  uint32_t bucket_count;  // keys in the chosen bucket
  uint32_t counter;       // output slots handed out by callers
};

// Warp 0: the bucket holding the `remaining`-th largest key, scanning the digits from 255 down.
__device__ inline void find_bucket(RadixState& s, uint32_t remaining) {
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

// The threshold T such that exactly k of the n keys are >= T (keys distinct, k < n). Where the caller knows
// that the T lies among the keys whose top `known_bits` bits are those of `prefix`, k counts from the largest
// of those keys (the larger ones are all >= T) and the search starts below them.
// MSB-first radix select, 8 bits per pass; it stops at the first pass whose chosen bucket is taken whole.
template <typename KeyAt>
__device__ uint64_t select_threshold(const KeyAt& key_at, int n, int k, RadixState& s, uint64_t prefix = 0,
                                     int known_bits = 0) {
  const int lane = threadIdx.x % kWarpSize;
  uint64_t mask = known_bits == 0 ? 0 : ~0ull << (64 - known_bits);
  uint32_t remaining = k;
  for (int shift = max(56 - known_bits, 0);; shift = max(shift - 8, 0)) {  // the last pass may overlap
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
    if (done || shift == 0) break;
  }
  return prefix;
}

// One bitonic compare-exchange in registers: `key` at index i, its partner's key, i's position in the pair.
__device__ __forceinline__ uint64_t bitonic_keep(uint64_t key, uint64_t partner, bool lower, int i, int size) {
  const bool descending = (i & size) == 0;
  return lower == descending ? max(key, partner) : min(key, partner);
}

// The bitonic stages of merge sizes first_size .. last_size with strides below 64, in registers: each warp takes
// 64-key segments, lane l holding keys l and l + 32 of the segment.
__device__ inline void bitonic_segment_stages(uint64_t* keys, int n, int first_size, int last_size) {
  const int lane = threadIdx.x % kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;
  for (int segment = threadIdx.x / kWarpSize; segment * 64 < n; segment += num_warps) {
    const int i = segment * 64 + lane;
    uint64_t a = keys[i];
    uint64_t b = keys[i + 32];
    for (int size = first_size; size <= last_size; size <<= 1) {
      if (size >= 64) {
        const uint64_t first = bitonic_keep(a, b, true, i, size);
        b = bitonic_keep(b, a, false, i + 32, size);
        a = first;
      }
      for (int stride = min(size / 2, 16); stride > 0; stride >>= 1) {
        const bool lower = (lane & stride) == 0;
        a = bitonic_keep(a, __shfl_xor_sync(kFullMask, a, stride), lower, i, size);
        b = bitonic_keep(b, __shfl_xor_sync(kFullMask, b, stride), lower, i + 32, size);
      }
    }
    keys[i] = a;
    keys[i + 32] = b;
  }
}

// Sorts keys[0, n) descending in place; n is a power of two. Below 64 keys the buffer is padded with zeros to
// 64, so it needs room for max(n, 64) keys. Strides of 64 and up go through shared memory (one barrier per
// stage), the rest through registers and shuffles: 18 barriers for 1024 keys instead of 55.
__device__ inline void bitonic_sort_desc(uint64_t* keys, int n) {
  for (int i = n + threadIdx.x; i < 64; i += blockDim.x) keys[i] = 0;
  n = max(n, 64);
  __syncthreads();
  bitonic_segment_stages(keys, n, 2, 64);
  __syncthreads();
  for (int size = 128; size <= n; size <<= 1) {
    for (int stride = size / 2; stride >= 64; stride >>= 1) {
      for (int i = threadIdx.x; i < n / 2; i += blockDim.x) {
        const int lo = ((i & -stride) << 1) | (i & (stride - 1));  // the i-th pair's first element
        const int hi = lo + stride;
        const bool descending = (lo & size) == 0;
        const uint64_t x = keys[lo];
        const uint64_t y = keys[hi];
        if ((x < y) == descending) {
          keys[lo] = y;
          keys[hi] = x;
        }
      }
      __syncthreads();
    }
    bitonic_segment_stages(keys, n, size, size);
    __syncthreads();
  }
}

// out[i] = value_at(0) + ... + value_at(i - 1) for i < n, out[n] = the total, which is also returned. Each
// thread takes at most kScanItems contiguous items; `warp_sums` holds one int per warp.
constexpr int kScanItems = 8;
template <typename ValueAt>
__device__ int block_exclusive_scan(int n, const ValueAt& value_at, int* out, int* warp_sums) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;
  const int per_thread = (n + blockDim.x - 1) / blockDim.x;
  const int begin = min(n, static_cast<int>(threadIdx.x) * per_thread);
  const int end = min(n, begin + per_thread);
  int items[kScanItems];
  int sum = 0;
#pragma unroll
  for (int u = 0; u < kScanItems; ++u) {
    items[u] = begin + u < end ? value_at(begin + u) : 0;
    sum += items[u];
  }
  int inclusive = sum;
#pragma unroll
  for (int offset = 1; offset < kWarpSize; offset <<= 1) {
    const int v = __shfl_up_sync(kFullMask, inclusive, offset);
    if (lane >= offset) inclusive += v;
  }
  if (lane == kWarpSize - 1) warp_sums[warp] = inclusive;
  __syncthreads();
  int before = 0;
  int total = 0;
  for (int w = 0; w < num_warps; ++w) {
    const int s = warp_sums[w];
    before += w < warp ? s : 0;
    total += s;
  }
  int running = before + inclusive - sum;
#pragma unroll
  for (int u = 0; u < kScanItems; ++u) {
    if (begin + u < end) out[begin + u] = running;
    running += items[u];
  }
  if (threadIdx.x == 0) out[n] = total;
  __syncthreads();
  return total;
}

}  // namespace ddtree::cuda
