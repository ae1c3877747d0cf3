// Float vectors for the CPU kernels, written once with GCC/Clang vector extensions.
//
// The build passes no -march flag, so the kernels that need wide vectors are compiled several times from
// the same templates: each entry point carries a target attribute (DDTREE_TARGET_AVX512, _AVX2) and every
// helper below is always_inline, so it is compiled for its caller's instruction set. Lanes<W> is W floats;
// on a target narrower than W the compiler splits each operation, which is still correct.
#pragma once

#include <cstdint>
#include <cstring>
#include <utility>

#pragma GCC diagnostic ignored "-Wpsabi"  // vectors never cross a non-inlined call: no ABI to keep

#define DDTREE_ALWAYS_INLINE inline __attribute__((always_inline))

#if defined(__x86_64__)
#define DDTREE_X86_64 1
#define DDTREE_TARGET_AVX512 __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,avx2,fma")))
#define DDTREE_TARGET_AVX2 __attribute__((target("avx2,fma")))
#endif

namespace ddtree::cpu::simd {

template <int W>
struct Lanes {
  static constexpr int kWidth = W;
  typedef float F __attribute__((vector_size(4 * W)));
  typedef int32_t I __attribute__((vector_size(4 * W)));
};

template <class L>
DDTREE_ALWAYS_INLINE typename L::F load(const float* p) {
  typename L::F v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

template <class L>
DDTREE_ALWAYS_INLINE void store(float* p, typename L::F v) {
  std::memcpy(p, &v, sizeof(v));
}

// x in every lane. GCC builds a vector-extension broadcast (x - F{}) lane by lane, a load and an insert per lane,
// and so it does through a helper over an index sequence; x in lane 0 shuffled to every lane, the indices written
// out here, is one vbroadcastss.
template <class L>
DDTREE_ALWAYS_INLINE typename L::F splat(float x) {
  const typename L::F v = {x};
  if constexpr (L::kWidth == 16) {
    return __builtin_shufflevector(v, v, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  } else if constexpr (L::kWidth == 8) {
    return __builtin_shufflevector(v, v, 0, 0, 0, 0, 0, 0, 0, 0);
  } else if constexpr (L::kWidth == 4) {
    return __builtin_shufflevector(v, v, 0, 0, 0, 0);
  } else {
    return x - typename L::F{};  // x - 0 is x for every x, -0 included (x + 0 is not)
  }
}

// Lanes of a where mask (a comparison's result: all ones or zero) is set, else lanes of b.
template <class L>
DDTREE_ALWAYS_INLINE typename L::F select(typename L::I mask, typename L::F a, typename L::F b) {
  using I = typename L::I;
  return (typename L::F)((mask & (I)a) | (~mask & (I)b));
}

// Whether any lane of a comparison's result is set: OR the halves down to 64 bits.
template <class L>
DDTREE_ALWAYS_INLINE bool any_set(typename L::I mask) {
  if constexpr (sizeof(mask) == sizeof(uint64_t)) {
    uint64_t word;
    std::memcpy(&word, &mask, sizeof(word));
    return word != 0;
  } else {
    using Half = Lanes<L::kWidth / 2>;
    typename Half::I low, high;
    std::memcpy(&low, &mask, sizeof(low));
    std::memcpy(&high, reinterpret_cast<const char*>(&mask) + sizeof(low), sizeof(high));
    return any_set<Half>(low | high);
  }
}

template <class L>
DDTREE_ALWAYS_INLINE typename L::F max(typename L::F a, typename L::F b) {
  return select<L>(a > b, a, b);
}

// exp(x) for x <= 0 (what a softmax needs: scores minus their running max), within 2 ulp of expf; 0 where
// expf would be subnormal or zero (x < -87.3, -inf included). Cephes' range reduction and polynomial.
template <class L>
DDTREE_ALWAYS_INLINE typename L::F exp_nonpositive(typename L::F x) {
  using F = typename L::F;
  using I = typename L::I;
  constexpr float kMinArg = -87.33654f;  // log(FLT_MIN)
  const I underflow = x < kMinArg;
  x = max<L>(x, splat<L>(kMinArg));
  const F scaled = x * 1.44269504088896341f + 0.5f;
  F n = __builtin_convertvector(__builtin_convertvector(scaled, I), F);  // truncation, then floor:
  n = select<L>(n > scaled, n - 1.0f, n);
  x = x - n * 0.693359375f;
  x = x - n * -2.12194440e-4f;
  F p = splat<L>(1.9875691500e-4f);
  p = p * x + 1.3981999507e-3f;
  p = p * x + 8.3334519073e-3f;
  p = p * x + 4.1665795894e-2f;
  p = p * x + 1.6666665459e-1f;
  p = p * x + 5.0000001201e-1f;
  p = p * (x * x) + x + 1.0f;
  const I two_to_n = (__builtin_convertvector(n, I) + 127) << 23;
  return select<L>(underflow, F{}, p * (F)two_to_n);
}

// dst[c][r] = src[r][c] for a W x W tile (rows `*_stride` floats apart): log2(W) rounds of swapping
// off-diagonal blocks, in registers where the compiler has __builtin_shufflevector, else element by element.
#if defined(__has_builtin)
#if __has_builtin(__builtin_shufflevector)
#define DDTREE_HAS_SHUFFLEVECTOR 1
#endif
#endif

#ifdef DDTREE_HAS_SHUFFLEVECTOR
// Lane l of the low (kHigh false) or high half of a block swap at granularity G: within each group of 2G
// lanes, the low output takes the first G lanes of a then of b, the high output the last G of each.
template <int W, int G, bool kHigh>
constexpr int swap_lane(int l) {
  const int base = l / (2 * G) * 2 * G + (kHigh ? G : 0), pos = l % (2 * G);
  return pos < G ? base + pos : W + base + pos - G;
}

template <class L, int G, bool kHigh, size_t... l>
DDTREE_ALWAYS_INLINE typename L::F swap_blocks(typename L::F a, typename L::F b, std::index_sequence<l...>) {
  return __builtin_shufflevector(a, b, swap_lane<L::kWidth, G, kHigh>(l)...);
}

template <class L, int G>
DDTREE_ALWAYS_INLINE void swap_round(typename L::F* rows) {
  using Lanes = std::make_index_sequence<L::kWidth>;
#pragma GCC unroll 16
  for (int i = 0; i < L::kWidth; ++i) {
    if (i & G) continue;
    const typename L::F low = swap_blocks<L, G, false>(rows[i], rows[i + G], Lanes{});
    rows[i + G] = swap_blocks<L, G, true>(rows[i], rows[i + G], Lanes{});
    rows[i] = low;
  }
  if constexpr (G > 1) swap_round<L, G / 2>(rows);
}
#endif

template <class L>
DDTREE_ALWAYS_INLINE void transpose_tile(const float* src, int64_t src_stride, float* dst, int64_t dst_stride) {
  constexpr int W = L::kWidth;
#ifdef DDTREE_HAS_SHUFFLEVECTOR
  typename L::F rows[W];
#pragma GCC unroll 16
  for (int i = 0; i < W; ++i) rows[i] = load<L>(src + i * src_stride);
  swap_round<L, W / 2>(rows);
#pragma GCC unroll 16
  for (int i = 0; i < W; ++i) store<L>(dst + i * dst_stride, rows[i]);
#else
  for (int c = 0; c < W; ++c) {
    for (int r = 0; r < W; ++r) dst[c * dst_stride + r] = src[r * src_stride + c];
  }
#endif
}

}  // namespace ddtree::cpu::simd
