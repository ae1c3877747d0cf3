// cache_attn's tensor-core kernel and the merge of its splits (cache_attn.cuh has the contract and the layout).
#include <algorithm>
#include <cstdint>

#include "cache_attn.cuh"
#include "common.cuh"
#include "verify_attn_mma.cuh"

namespace ddtree::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kRowsQ = 64;   // query rows per block
constexpr int kKeys = 64;    // keys per tile
constexpr int kWarps = 4;    // 16 query rows each
constexpr int kThreads = kWarps * kWarpSize;
constexpr float kLog2e = 1.4426950408889634f;

template <int D>
constexpr size_t smem_bytes() {
  return static_cast<size_t>(5) * kRowsQ * D * sizeof(bf16);  // Q, 2 x K, 2 x V
}

// Element offset of 16-byte chunk `chunk` of row `row` in a tile of D-element rows, swizzled so that the 8 rows an
// ldmatrix reads at one chunk fall in 8 different 16-byte bank groups.
template <int D>
__device__ __forceinline__ int swz(int row, int chunk) {
  constexpr int kChunks = D / 8;
  constexpr int kRowsPerLine = kChunks >= 8 ? 1 : 8 / kChunks;
  constexpr int kMask = (kChunks >= 8 ? 8 : kChunks) - 1;
  return (row * kChunks + (chunk ^ ((row / kRowsPerLine) & kMask))) * 8;
}

// The 64 keys (or values) from `key0` of head kvh into a swizzled tile; rows at or past `end` become zeros.
template <int D>
__device__ __forceinline__ void load_kv_tile(bf16* dst, const bf16* src, int key0, int end, int kv_heads, int kvh) {
  constexpr int kChunks = D / 8;
  for (int e = threadIdx.x; e < kKeys * kChunks; e += kThreads) {
    const int r = e / kChunks;
    const int c = e - r * kChunks;
    const bool ok = key0 + r < end;
    const size_t row = ok ? static_cast<size_t>(key0 + r) * kv_heads + kvh : 0;
    cp_async_16(dst + swz<D>(r, c), src + row * D + c * 8, ok);
  }
}

template <int D>
__global__ void __launch_bounds__(kThreads) cache_attn_kernel(const CacheAttnArgs a) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  constexpr int kChunks = D / 8;
  constexpr int kTile = kRowsQ * D;
  extern __shared__ uint4 s_raw[];
  bf16* s_q = reinterpret_cast<bf16*>(s_raw);
  bf16* s_k = s_q + kTile;       // 2 buffers
  bf16* s_v = s_k + 2 * kTile;   // 2 buffers

  const int split = blockIdx.x;
  const int kvh = blockIdx.y;
  const int groups = a.num_heads / a.num_kv_heads;
  const int num_rows = a.num_nodes * groups;  // this head's query rows
  const int row0 = blockIdx.z * kRowsQ;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int g = lane / 4;
  const int q4 = lane % 4;

  const int64_t listed = *a.num_visible;
  const int visible = listed < 1 ? 1 : (listed > a.cache_rows ? a.cache_rows : static_cast<int>(listed));
  const int per_split = round_up(ceil_div(visible, a.num_splits), kKeys);
  const int begin = split * per_split;
  const int end = min(begin + per_split, visible);
  const size_t part_row0 = (static_cast<size_t>(split) * a.num_kv_heads + kvh) * num_rows;

  if (begin >= end) {  // an empty split: nothing for the merge to take
    for (int r = threadIdx.x; r < kRowsQ && row0 + r < num_rows; r += kThreads) {
      a.partial_ml[(part_row0 + row0 + r) * 2] = neg_inf();
      a.partial_ml[(part_row0 + row0 + r) * 2 + 1] = 0.0f;
    }
    return;
  }

  const bf16* q = static_cast<const bf16*>(a.q);
  for (int e = threadIdx.x; e < kRowsQ * kChunks; e += kThreads) {
    const int r = e / kChunks;
    const int c = e - r * kChunks;
    const int qr = row0 + r;
    const bool ok = qr < num_rows;
    const int n = ok ? qr / groups : 0;
    const size_t at = ok ? static_cast<size_t>(n) * a.q_row_stride + static_cast<size_t>(kvh * groups + qr - n * groups) * D : 0;
    cp_async_16(s_q + swz<D>(r, c), q + at + c * 8, ok);
  }
  const bf16* keys = static_cast<const bf16*>(a.keys);
  const bf16* values = static_cast<const bf16*>(a.values);
  load_kv_tile<D>(s_k, keys, begin, end, a.num_kv_heads, kvh);
  load_kv_tile<D>(s_v, values, begin, end, a.num_kv_heads, kvh);
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();

  uint32_t qf[D / 16][4];  // this warp's 16 query rows as A fragments, for every tile
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) ldmatrix_x4(qf[ks], s_q + swz<D>(16 * warp + lane % 16, 2 * ks + lane / 16));

  float o[D / 8][4];
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
#pragma unroll
    for (int k = 0; k < 4; ++k) o[j][k] = 0.0f;
  }
  float m_run[2] = {neg_inf(), neg_inf()};
  float l_run[2] = {0.0f, 0.0f};
  const float scale_log2 = a.scale * kLog2e;

  int buf = 0;
  for (int key0 = begin; key0 < end; key0 += kKeys, buf ^= 1) {
    if (key0 > begin) {
      cp_async_wait_all();
      __syncthreads();  // this tile is in, and every warp is done with the other buffer
    }
    if (key0 + kKeys < end) {
      load_kv_tile<D>(s_k + (buf ^ 1) * kTile, keys, key0 + kKeys, end, a.num_kv_heads, kvh);
      load_kv_tile<D>(s_v + (buf ^ 1) * kTile, values, key0 + kKeys, end, a.num_kv_heads, kvh);
    }
    cp_async_commit();
    const bf16* tk = s_k + buf * kTile;
    const bf16* tv = s_v + buf * kTile;

    float s[kKeys / 8][4];
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; ++nt) {
#pragma unroll
      for (int k = 0; k < 4; ++k) s[nt][k] = 0.0f;
    }
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
#pragma unroll
      for (int pair = 0; pair < kKeys / 16; ++pair) {
        const int mi = lane / 8;
        uint32_t b[4];
        ldmatrix_x4(b, tk + swz<D>(16 * pair + (mi / 2) * 8 + lane % 8, 2 * ks + mi % 2));
        mma_bf16_16816(s[2 * pair], qf[ks], b[0], b[1]);
        mma_bf16_16816(s[2 * pair + 1], qf[ks], b[2], b[3]);
      }
    }

    const bool needs_mask = key0 + kKeys > end;
    float mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; ++nt) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float v = s[nt][j] * scale_log2;
        if (needs_mask && key0 + 8 * nt + 2 * q4 + (j & 1) >= end) v = neg_inf();
        s[nt][j] = v;
        mx[j / 2] = fmaxf(mx[j / 2], v);
      }
    }
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float m_new = fmaxf(m_run[h], quad_max(mx[h]));  // finite: every tile holds a visible key
      alpha[h] = exp2f(m_run[h] - m_new);
      m_run[h] = m_new;
      l_run[h] *= alpha[h];
    }
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      o[j][0] *= alpha[0];
      o[j][1] *= alpha[0];
      o[j][2] *= alpha[1];
      o[j][3] *= alpha[1];
    }
#pragma unroll
    for (int nt = 0; nt < kKeys / 8; ++nt) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        s[nt][j] = exp2f(s[nt][j] - m_run[j / 2]);
        l_run[j / 2] += s[nt][j];
      }
    }

    // O += P V: P's accumulators are already the A fragments of the 16-key steps.
#pragma unroll
    for (int ks = 0; ks < kKeys / 16; ++ks) {
      const uint32_t pa[4] = {pack_bf16(s[2 * ks][0], s[2 * ks][1]), pack_bf16(s[2 * ks][2], s[2 * ks][3]),
                              pack_bf16(s[2 * ks + 1][0], s[2 * ks + 1][1]),
                              pack_bf16(s[2 * ks + 1][2], s[2 * ks + 1][3])};
#pragma unroll
      for (int pair = 0; pair < D / 16; ++pair) {
        const int mi = lane / 8;
        uint32_t r[4];
        ldmatrix_x4_trans(r, tv + swz<D>(16 * ks + (mi % 2) * 8 + lane % 8, 2 * pair + mi / 2));
        mma_bf16_16816(o[2 * pair], pa, r[0], r[1]);
        mma_bf16_16816(o[2 * pair + 1], pa, r[2], r[3]);
      }
    }
  }

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int qr = row0 + 16 * warp + g + 8 * h;
    const float l = quad_sum(l_run[h]);
    if (qr >= num_rows) continue;
    float* dst = a.partial_o + (part_row0 + qr) * D;
    const float inv = 1.0f / l;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      *reinterpret_cast<float2*>(dst + 8 * j + 2 * q4) = make_float2(o[j][2 * h] * inv, o[j][2 * h + 1] * inv);
    }
    if (q4 == 0) {
      a.partial_ml[(part_row0 + qr) * 2] = m_run[h];
      a.partial_ml[(part_row0 + qr) * 2 + 1] = l;
    }
  }
#endif
}

// out for query row (kvh, r): the splits' normalised partial results weighted by their share of the row's sum.
// A block per row, a thread per dimension; the splits' maxima and sums are read once, in parallel, into shared
// memory, so that the loop over the splits issues independent loads.
constexpr int kMaxMergeSplits = 1024;

__global__ void cache_attn_merge_kernel(const CacheAttnArgs a) {
  __shared__ float s_weight[kMaxMergeSplits];
  __shared__ float s_total;
  wait_for_previous_grid();
  const int qr = blockIdx.x;
  const int kvh = blockIdx.y;
  const int groups = a.num_heads / a.num_kv_heads;
  const int num_rows = a.num_nodes * groups;
  const size_t stride = static_cast<size_t>(a.num_kv_heads) * num_rows;  // rows between two splits' parts
  const size_t row = static_cast<size_t>(kvh) * num_rows + qr;
  for (int s = threadIdx.x; s < a.num_splits; s += blockDim.x) {
    s_weight[s] = a.partial_ml[(s * stride + row) * 2];  // the split's max first
  }
  __syncthreads();
  if (threadIdx.x < kWarpSize) {
    float m = neg_inf();
    for (int s = threadIdx.x; s < a.num_splits; s += kWarpSize) m = fmaxf(m, s_weight[s]);
    for (int offset = 16; offset > 0; offset >>= 1) m = fmaxf(m, __shfl_xor_sync(kFullMask, m, offset));
    float total = 0.0f;
    for (int s = threadIdx.x; s < a.num_splits; s += kWarpSize) {
      const float l = a.partial_ml[(s * stride + row) * 2 + 1];
      s_weight[s] = l == 0.0f ? 0.0f : l * exp2f(s_weight[s] - m);  // an empty split: its part was never written
      total += s_weight[s];
    }
    total = warp_sum(total);
    if (threadIdx.x == 0) s_total = total;
  }
  __syncthreads();
  const int d = threadIdx.x;
  float acc = 0.0f;
#pragma unroll 8
  for (int s = 0; s < a.num_splits; ++s) {
    if (s_weight[s] != 0.0f) acc = fmaf(s_weight[s], a.partial_o[(s * stride + row) * a.head_dim + d], acc);
  }
  const int n = qr / groups;
  const size_t head = static_cast<size_t>(n) * a.num_heads + kvh * groups + (qr - n * groups);
  static_cast<bf16*>(a.out)[head * a.head_dim + d] = __float2bfloat16_rn(acc / s_total);
}

template <int D>
cudaError_t launch(const CacheAttnArgs& a, cudaStream_t stream) {
  DDTREE_CUDA_TRY(allow_dynamic_smem(cache_attn_kernel<D>, smem_bytes<D>()));
  const int num_rows = a.num_nodes * (a.num_heads / a.num_kv_heads);
  const dim3 grid(a.num_splits, a.num_kv_heads, ceil_div(num_rows, kRowsQ));
  cache_attn_kernel<D><<<grid, kThreads, smem_bytes<D>(), stream>>>(a);
  DDTREE_CUDA_TRY(cudaGetLastError());
  return launch_dependent(cache_attn_merge_kernel, dim3(num_rows, a.num_kv_heads), dim3(D), 0, stream, a);
}

}  // namespace

bool CacheAttnSupported(const CacheAttnArgs& a) {
  return (a.head_dim == 32 || a.head_dim == 64 || a.head_dim == 128) && aligned_16(a.q) && a.q_row_stride % 8 == 0 &&
         aligned_16(a.keys) && aligned_16(a.values) && gpu_has_mma_sync();
}

int CacheAttnSplits(int num_nodes, int num_heads, int num_kv_heads, int cache_rows, int num_sms) {
  const int tiles = num_kv_heads * ceil_div(num_nodes * (num_heads / num_kv_heads), kRowsQ);
  return std::clamp(ceil_div(num_sms, tiles), 1, std::clamp(ceil_div(cache_rows, kKeys), 1, kMaxMergeSplits));
}

cudaError_t CacheAttn(const CacheAttnArgs& a, cudaStream_t stream) {
  if (a.num_nodes == 0) return cudaSuccess;
  switch (a.head_dim) {
    case 32: return launch<32>(a, stream);
    case 64: return launch<64>(a, stream);
    default: return launch<128>(a, stream);
  }
}

}  // namespace ddtree::cuda
