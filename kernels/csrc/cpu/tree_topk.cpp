// Each depth's top k tokens for tree_build on the CPU: one scan per row, the rows in parallel.
//
// Each token is ranked by one integer key (logprob descending, then token ascending). A heap holds the k
// best keys so far, starting with the row's first k; a later token enters only with a logprob above the
// worst of them (on equal logprobs the earlier token ranks first, so a later one never displaces it). Most
// tokens of a long row fail that in a vector test of kChunk logprobs at once: once i tokens are scanned, a
// chunk holds one that enters with probability about kChunk * k / i. The k keys are then radix-sorted.
#include "tree_topk.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "isa.h"
#include "simd.h"

namespace ddtree::cpu {
namespace {

constexpr int64_t kChunk = 16;               // logprobs per vector test
constexpr int64_t kMinThreadWork = 1 << 13;  // logprobs a thread should scan, at least, to be worth waking

// A candidate as one integer, smaller ranking first: the logprob's order-preserving bits inverted
// (descending) above the token (ascending). -0 is keyed as +0: the two tie, as floats compare.
uint64_t rank_key(float logprob, int64_t token) {
  const float canonical = logprob + 0.0f;
  uint32_t bits;
  std::memcpy(&bits, &canonical, sizeof(bits));
  const uint32_t ascending = (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
  return static_cast<uint64_t>(~ascending) << 32 | static_cast<uint32_t>(token);
}

int64_t key_token(uint64_t key) { return static_cast<int64_t>(key & 0xffffffffu); }

// Bit i set where logprobs[i] is above `threshold` or NaN, for the kChunk logprobs; a vector test first, as
// almost every chunk of a long row has no such logprob.
template <class L>
DDTREE_ALWAYS_INLINE uint32_t above_mask(const float* logprobs, float threshold) {
  typename L::I hit{};
#pragma GCC unroll 4
  for (int64_t i = 0; i < kChunk; i += L::kWidth) hit |= ~(simd::load<L>(logprobs + i) <= threshold);
  if (!simd::any_set<L>(hit)) return 0;
  uint32_t mask = 0;
  for (int64_t i = 0; i < kChunk; ++i) mask |= static_cast<uint32_t>(!(logprobs[i] <= threshold)) << i;
  return mask;
}

// Put `key` in place of the heap's root (its worst key) and sift it down: a max-heap of the k best keys.
DDTREE_ALWAYS_INLINE void replace_worst(uint64_t* heap, int64_t k, uint64_t key) {
  int64_t i = 0;
  for (int64_t c = 1; c < k; c = 2 * i + 1) {
    c += c + 1 < k && heap[c + 1] > heap[c];
    if (heap[c] <= key) break;
    heap[i] = heap[c];
    i = c;
  }
  heap[i] = key;
}

// Sorts keys[0, n) ascending, through scratch[0, n): a stable counting pass per byte, least significant
// first, over the bytes in which the keys differ. No comparisons, so no mispredicted branches.
void radix_sort(uint64_t* keys, uint64_t* scratch, int64_t n) {
  uint64_t any_set = 0, all_set = ~uint64_t{0};
  for (int64_t i = 0; i < n; ++i) {
    any_set |= keys[i];
    all_set &= keys[i];
  }
  uint64_t* src = keys;
  uint64_t* dst = scratch;
  for (int shift = 0; shift < 64; shift += 8) {
    if (((any_set ^ all_set) >> shift & 0xff) == 0) continue;
    int64_t start[257] = {};
    for (int64_t i = 0; i < n; ++i) ++start[(src[i] >> shift & 0xff) + 1];
    for (int b = 0; b < 256; ++b) start[b + 1] += start[b];
    for (int64_t i = 0; i < n; ++i) dst[start[src[i] >> shift & 0xff]++] = src[i];
    std::swap(src, dst);
  }
  if (src != keys) std::copy(src, src + n, keys);
}

// The k best keys of a row, unordered, into heap[0, k): a heap of the k best so far, starting with the
// row's first k; a later token enters only with a logprob above the worst of them. Returns the column of
// the row's first NaN, or -1.
template <class L>
DDTREE_ALWAYS_INLINE int64_t scan_row(const float* row, int64_t vocab, int64_t k, uint64_t* heap) {
  for (int64_t t = 0; t < k; ++t) {
    if (std::isnan(row[t])) return t;
    heap[t] = rank_key(row[t], t);
  }
  float threshold = std::numeric_limits<float>::infinity();  // k = 0: the scan only looks for NaN
  if (k > 0) {
    std::make_heap(heap, heap + k);
    threshold = row[key_token(heap[0])];
  }
  for (int64_t t0 = k; t0 < vocab; t0 += kChunk) {
    const int64_t size = std::min(kChunk, vocab - t0);
    uint32_t mask = size == kChunk ? above_mask<L>(row + t0, threshold) : (uint32_t{1} << size) - 1;
    for (; mask != 0; mask &= mask - 1) {
      const int64_t t = t0 + __builtin_ctz(mask);
      if (std::isnan(row[t])) return t;
      if (row[t] <= threshold) continue;  // the threshold rose since the chunk was tested
      replace_worst(heap, k, rank_key(row[t], t));
      threshold = row[key_token(heap[0])];
    }
  }
  return -1;
}

// Rows at most kKeyAllRatio times k long skip the scan: every token's key is sorted.
constexpr int64_t kKeyAllRatio = 4;

// The row's k best tokens, best first, into tokens[0, k); returns the column of its first NaN, or -1.
// keys and scratch hold vocab keys where the row is short next to k, else k.
template <class L>
DDTREE_ALWAYS_INLINE int64_t top_k_of_row(const float* row, int64_t vocab, int64_t k, uint64_t* keys,
                                          uint64_t* scratch, int64_t* tokens) {
  const int64_t num_keys = kKeyAllRatio * k >= vocab ? vocab : k;
  if (num_keys == vocab) {
    for (int64_t t = 0; t < vocab; ++t) {
      if (std::isnan(row[t])) return t;
      keys[t] = rank_key(row[t], t);
    }
  } else if (const int64_t nan_at = scan_row<L>(row, vocab, k, keys); nan_at >= 0) {
    return nan_at;
  }
  radix_sort(keys, scratch, num_keys);
  for (int64_t r = 0; r < k; ++r) tokens[r] = key_token(keys[r]);
  return -1;
}

template <class L>
DDTREE_ALWAYS_INLINE void top_k_of_rows(const float* logprobs, int64_t begin, int64_t end, int64_t vocab, int64_t k,
                                        int64_t* tokens, int64_t* first_nan) {
  std::vector<uint64_t> keys(kKeyAllRatio * k >= vocab ? vocab : k), scratch(keys.size());
  for (int64_t d = begin; d < end; ++d) {
    first_nan[d] = top_k_of_row<L>(logprobs + d * vocab, vocab, k, keys.data(), scratch.data(), tokens + d * k);
  }
}

// One compiled copy of the scan per instruction set (simd.h).
using RowsFn = void (*)(const float*, int64_t, int64_t, int64_t, int64_t, int64_t*, int64_t*);

#ifdef DDTREE_X86_64
DDTREE_TARGET_AVX512 void top_k_of_rows_avx512(const float* logprobs, int64_t begin, int64_t end, int64_t vocab,
                                               int64_t k, int64_t* tokens, int64_t* first_nan) {
  top_k_of_rows<simd::Lanes<16>>(logprobs, begin, end, vocab, k, tokens, first_nan);
}
DDTREE_TARGET_AVX2 void top_k_of_rows_avx2(const float* logprobs, int64_t begin, int64_t end, int64_t vocab,
                                           int64_t k, int64_t* tokens, int64_t* first_nan) {
  top_k_of_rows<simd::Lanes<8>>(logprobs, begin, end, vocab, k, tokens, first_nan);
}
#endif
void top_k_of_rows_generic(const float* logprobs, int64_t begin, int64_t end, int64_t vocab, int64_t k,
                           int64_t* tokens, int64_t* first_nan) {
  top_k_of_rows<simd::Lanes<4>>(logprobs, begin, end, vocab, k, tokens, first_nan);
}

RowsFn rows_fn(Isa isa) {
#ifdef DDTREE_X86_64
  if (isa == Isa::kAvx512) return top_k_of_rows_avx512;
  if (isa == Isa::kAvx2) return top_k_of_rows_avx2;
#endif
  return top_k_of_rows_generic;
}

}  // namespace

void tree_top_k(const float* logprobs, int64_t num_rows, int64_t vocab, int64_t k, std::vector<int64_t>& tokens,
                std::vector<float>& values) {
  TORCH_CHECK(vocab <= (int64_t{1} << 32), "draft_logprobs [L, V] needs V <= 2^32, got V = ", vocab);
  tokens.resize(num_rows * k);
  values.resize(num_rows * k);
  std::vector<int64_t> first_nan(num_rows);
  const RowsFn rows = rows_fn(chosen_isa());
  const int64_t grain = std::max<int64_t>(1, kMinThreadWork / vocab);  // short rows: not worth a thread
  at::parallel_for(0, num_rows, grain, [&](int64_t begin, int64_t end) {
    rows(logprobs, begin, end, vocab, k, tokens.data(), first_nan.data());
  });
  for (int64_t d = 0; d < num_rows; ++d) {
    TORCH_CHECK(first_nan[d] < 0, "draft_logprobs has NaN at [", d, ", ", first_nan[d],
                "]; the drafter must return log-probabilities (finite or -inf)");
  }
  for (int64_t d = 0; d < num_rows; ++d) {
    for (int64_t r = 0; r < k; ++r) values[d * k + r] = logprobs[d * vocab + tokens[d * k + r]];
  }
}

}  // namespace ddtree::cpu
