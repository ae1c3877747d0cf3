// Split-KV absorbed-MLA attention kernels (design: verify_attn.cuh).
#include <algorithm>
#include <type_traits>

#include "common.cuh"
#include "verify_attn.cuh"
#include "verify_attn_mma.cuh"

namespace ddtree::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kHeadsPerWarp = 2;
constexpr int kHeadsPerBlock = kWarps * kHeadsPerWarp;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kTileRows = 32;
constexpr int kRowGroup = 8;  // rows whose scores one transpose-reduction finishes
constexpr int kMaxLatChunks = kVerifyAttnMaxLatDim / kWarpSize;
constexpr int kMaxRopeChunks = kVerifyAttnMaxRopeDim / kWarpSize;
constexpr int kMaxSplits = 256;
constexpr int kMinSplitRows = 256;
constexpr int kMaxCombineThreads = 1024;
static_assert(kMaxCombineThreads >= kVerifyAttnMaxLatDim, "one combine thread per column at least");
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }

// Per block: the rows [begin, end) of the visible range [0, prefix_len + N) that this split covers.
struct SplitRows {
  int prefix;
  int begin;
  int end;
};

template <typename T>
__device__ SplitRows split_rows(const VerifyAttnArgs<T>& a, int split, int tile_rows) {
  const int64_t raw = *a.prefix_len;
  const int prefix = static_cast<int>(min(max(raw, int64_t{0}), static_cast<int64_t>(a.cache_rows - a.num_nodes)));
  const int len = prefix + a.num_nodes;
  const int per_split = round_up(ceil_div(len, a.num_splits), tile_rows);
  const int begin = split * per_split;
  return {prefix, begin, min(len, begin + per_split)};
}

// kVec consecutive elements as floats (one 16-byte load when kVec > 1).
template <typename T, int kVec>
__device__ __forceinline__ void load_vec(const T* src, float* dst) {
  if constexpr (kVec == 1) {
    dst[0] = to_float(src[0]);
  } else if constexpr (sizeof(T) == 4) {
    static_assert(kVec == 4);
    const float4 v = *reinterpret_cast<const float4*>(src);
    dst[0] = v.x, dst[1] = v.y, dst[2] = v.z, dst[3] = v.w;
  } else {
    static_assert(kVec == 8);
    const uint4 raw = *reinterpret_cast<const uint4*>(src);
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // a bfloat16 is the top half of its float32: widening is a shift
      dst[2 * i] = __uint_as_float(words[i] << 16);
      dst[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    }
  }
}

// Rows [row0, row0 + num_rows) of a [S, width] matrix into shared rows at column `col0` (fp32).
template <typename T, int kVec>
__device__ void load_rows(const T* src, int width, int row0, int num_rows, float* s_tile, int stride, int col0) {
  const int vecs_per_row = width / kVec;
  for (int e = threadIdx.x; e < num_rows * vecs_per_row; e += kThreads) {
    const int r = e / vecs_per_row;
    const int c = (e - r * vecs_per_row) * kVec;
    float v[kVec];
    load_vec<T, kVec>(src + static_cast<size_t>(row0 + r) * width + c, v);
#pragma unroll
    for (int i = 0; i < kVec; ++i) s_tile[r * stride + col0 + c + i] = v[i];
  }
}

// Each lane holds 8 partial sums (one per row of a group); afterwards every lane holds the full warp
// sum for row (lane >> 2) & 7. 9 shuffles instead of 8 separate 5-shuffle reductions.
__device__ __forceinline__ float transpose_reduce8(float (&v)[kRowGroup], int lane) {
  const bool b4 = lane & 16, b3 = lane & 8, b2 = lane & 4;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float keep = b4 ? v[i + 4] : v[i];
    const float send = b4 ? v[i] : v[i + 4];
    v[i] = keep + __shfl_xor_sync(kFullMask, send, 16);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float keep = b3 ? v[i + 2] : v[i];
    const float send = b3 ? v[i] : v[i + 2];
    v[i] = keep + __shfl_xor_sync(kFullMask, send, 8);
  }
  const float keep = b2 ? v[1] : v[0];
  const float send = b2 ? v[0] : v[1];
  float sum = keep + __shfl_xor_sync(kFullMask, send, 4);
  sum += __shfl_xor_sync(kFullMask, sum, 2);
  sum += __shfl_xor_sync(kFullMask, sum, 1);
  return sum;
}

// Across the lanes holding different rows (lanes that differ in bits 2..4).
__device__ __forceinline__ float row_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(kFullMask, v, 4));
  v = fmaxf(v, __shfl_xor_sync(kFullMask, v, 8));
  return fmaxf(v, __shfl_xor_sync(kFullMask, v, 16));
}
__device__ __forceinline__ float row_sum(float v) {
  v += __shfl_xor_sync(kFullMask, v, 4);
  v += __shfl_xor_sync(kFullMask, v, 8);
  return v + __shfl_xor_sync(kFullMask, v, 16);
}

// Block (split, head tile, node). Lane `lane` of a warp owns latent columns lane, lane + 32, ... of its
// two heads: their query slice (scaled into log2 units), output accumulator and the running max / sum.
template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads) verify_attn_partial_kernel(VerifyAttnArgs<T> a) {
  extern __shared__ float s_kv[];  // [kTileRows, stride]: ckv row | pad | kpe row | pad, fp32
  __shared__ float s_p[kWarps][kHeadsPerWarp][kTileRows];
  __shared__ bool s_visible[kTileRows];
  const int node = blockIdx.z;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int lat_chunks = ceil_div(a.lat_dim, kWarpSize);
  const int rope_chunks = ceil_div(a.rope_dim, kWarpSize);
  const int stride = kWarpSize * (lat_chunks + rope_chunks);
  const int rope_col = kWarpSize * lat_chunks;
  const SplitRows rows = split_rows(a, blockIdx.x, kTileRows);

  int head[kHeadsPerWarp];
  bool head_ok[kHeadsPerWarp];
#pragma unroll
  for (int hh = 0; hh < kHeadsPerWarp; ++hh) {
    head[hh] = blockIdx.y * kHeadsPerBlock + warp * kHeadsPerWarp + hh;
    head_ok[hh] = head[hh] < a.num_heads;
  }
  const bool warp_ok = head_ok[0];
  const auto nh_index = [&](int hh) { return static_cast<size_t>(node) * a.num_heads + head[hh]; };
  // With several splits: workspace = [splits, N, H, R] unnormalised outputs, then [splits, N, H, 2] (max, sum).
  const size_t num_nh = static_cast<size_t>(a.num_nodes) * a.num_heads;
  const auto part_o = [&](int hh) { return a.workspace + (blockIdx.x * num_nh + nh_index(hh)) * a.lat_dim; };
  const auto part_ml = [&](int hh) {
    return a.workspace + a.num_splits * num_nh * a.lat_dim + 2 * (blockIdx.x * num_nh + nh_index(hh));
  };

  if (rows.begin >= rows.end) {  // a split past the visible rows (only with several splits)
#pragma unroll
    for (int hh = 0; hh < kHeadsPerWarp; ++hh) {
      if (head_ok[hh] && lane == 0) {
        part_ml(hh)[0] = neg_inf();
        part_ml(hh)[1] = 0.0f;
      }
    }
    return;
  }

  float q[kHeadsPerWarp][kMaxLatChunks];
  float q_rope[kHeadsPerWarp][kMaxRopeChunks];
  const float q_scale = a.scale * kLog2e;
#pragma unroll
  for (int hh = 0; hh < kHeadsPerWarp; ++hh) {
#pragma unroll
    for (int j = 0; j < kMaxLatChunks; ++j) {
      const int c = j * kWarpSize + lane;
      q[hh][j] = head_ok[hh] && c < a.lat_dim ? q_scale * to_float(a.q_lat[nh_index(hh) * a.lat_dim + c]) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kMaxRopeChunks; ++j) {
      const int c = j * kWarpSize + lane;
      q_rope[hh][j] = head_ok[hh] && c < a.rope_dim ? q_scale * to_float(a.q_pe[nh_index(hh) * a.rope_dim + c]) : 0.0f;
    }
  }
  // Zero once: the padding columns stay zero (finite) for every tile.
  for (int i = threadIdx.x; i < kTileRows * stride; i += kThreads) s_kv[i] = 0.0f;

  float m[kHeadsPerWarp], l[kHeadsPerWarp], acc[kHeadsPerWarp][kMaxLatChunks];
#pragma unroll
  for (int hh = 0; hh < kHeadsPerWarp; ++hh) {
    m[hh] = neg_inf();
    l[hh] = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxLatChunks; ++j) acc[hh][j] = 0.0f;
  }

  const bool* mask_row = a.block_mask + static_cast<size_t>(node) * a.num_nodes;
  for (int tile = rows.begin; tile < rows.end; tile += kTileRows) {
    const int num_rows = min(kTileRows, rows.end - tile);
    __syncthreads();  // the previous tile is consumed
    load_rows<T, kVec>(a.ckv, a.lat_dim, tile, num_rows, s_kv, stride, 0);
    load_rows<T, kVec>(a.kpe, a.rope_dim, tile, num_rows, s_kv, stride, rope_col);
    if (threadIdx.x < kTileRows) {
      const int u = tile + threadIdx.x;
      s_visible[threadIdx.x] = u < tile + num_rows && (u < rows.prefix || mask_row[u - rows.prefix]);
    }
    __syncthreads();
    if (!warp_ok) continue;

    // Scores in log2 units: lane holds rows kRowGroup * g + (lane >> 2 & 7).
    float score[kHeadsPerWarp][kTileRows / kRowGroup];
#pragma unroll
    for (int g = 0; g < kTileRows / kRowGroup; ++g) {
      float part[kHeadsPerWarp][kRowGroup] = {};
      if (g * kRowGroup < num_rows) {
        const float* base = s_kv + g * kRowGroup * stride + lane;
#pragma unroll
        for (int j = 0; j < kMaxLatChunks; ++j) {
          if (j >= lat_chunks) break;
#pragma unroll
          for (int r = 0; r < kRowGroup; ++r) {
            const float k = base[r * stride + j * kWarpSize];
#pragma unroll
            for (int hh = 0; hh < kHeadsPerWarp; ++hh) part[hh][r] = fmaf(q[hh][j], k, part[hh][r]);
          }
        }
#pragma unroll
        for (int j = 0; j < kMaxRopeChunks; ++j) {
          if (j >= rope_chunks) break;
#pragma unroll
          for (int r = 0; r < kRowGroup; ++r) {
            const float k = base[r * stride + rope_col + j * kWarpSize];
#pragma unroll
            for (int hh = 0; hh < kHeadsPerWarp; ++hh) part[hh][r] = fmaf(q_rope[hh][j], k, part[hh][r]);
          }
        }
      }
      const int row = g * kRowGroup + ((lane >> 2) & 7);
#pragma unroll
      for (int hh = 0; hh < kHeadsPerWarp; ++hh) {
        const float s = transpose_reduce8(part[hh], lane);
        score[hh][g] = s_visible[row] ? s : neg_inf();
      }
    }

    // Online softmax; a tile with nothing visible so far keeps p = 0 (no -inf - -inf).
    float alpha[kHeadsPerWarp];
#pragma unroll
    for (int hh = 0; hh < kHeadsPerWarp; ++hh) {
      float tile_max = score[hh][0];
#pragma unroll
      for (int g = 1; g < kTileRows / kRowGroup; ++g) tile_max = fmaxf(tile_max, score[hh][g]);
      const float m_new = fmaxf(m[hh], row_max(tile_max));
      const float m_safe = m_new == neg_inf() ? 0.0f : m_new;
      alpha[hh] = exp2f(m[hh] - m_safe);
      float p_sum = 0.0f;
#pragma unroll
      for (int g = 0; g < kTileRows / kRowGroup; ++g) {
        const float p = exp2f(score[hh][g] - m_safe);
        p_sum += p;
        if ((lane & 3) == 0) s_p[warp][hh][g * kRowGroup + ((lane >> 2) & 7)] = p;
      }
      l[hh] = l[hh] * alpha[hh] + row_sum(p_sum);
      m[hh] = m_new;
    }
    __syncwarp();

    // O = O * alpha + P V, the tile summed on its own first (fp32 error grows with the rows per sum).
    float tile_acc[kHeadsPerWarp][kMaxLatChunks] = {};
#pragma unroll 4
    for (int r = 0; r < num_rows; ++r) {
      float p[kHeadsPerWarp];
#pragma unroll
      for (int hh = 0; hh < kHeadsPerWarp; ++hh) p[hh] = s_p[warp][hh][r];
      const float* v_row = s_kv + r * stride + lane;
#pragma unroll
      for (int j = 0; j < kMaxLatChunks; ++j) {
        if (j >= lat_chunks) break;
        const float v = v_row[j * kWarpSize];
#pragma unroll
        for (int hh = 0; hh < kHeadsPerWarp; ++hh) tile_acc[hh][j] = fmaf(p[hh], v, tile_acc[hh][j]);
      }
    }
#pragma unroll
    for (int hh = 0; hh < kHeadsPerWarp; ++hh) {
#pragma unroll
      for (int j = 0; j < kMaxLatChunks; ++j) acc[hh][j] = fmaf(acc[hh][j], alpha[hh], tile_acc[hh][j]);
    }
  }

#pragma unroll
  for (int hh = 0; hh < kHeadsPerWarp; ++hh) {
    if (!head_ok[hh]) continue;
    if (a.num_splits == 1) {
      const float inv = l[hh] > 0.0f ? 1.0f / l[hh] : 0.0f;
      T* out = a.o_lat + nh_index(hh) * a.lat_dim;
#pragma unroll
      for (int j = 0; j < kMaxLatChunks; ++j) {
        const int c = j * kWarpSize + lane;
        if (c < a.lat_dim) out[c] = from_float<T>(acc[hh][j] * inv);
      }
      if (lane == 0) a.lse[nh_index(hh)] = l[hh] > 0.0f ? (m[hh] + log2f(l[hh])) * kLn2 : neg_inf();
    } else {
      float* out = part_o(hh);
#pragma unroll
      for (int j = 0; j < kMaxLatChunks; ++j) {
        const int c = j * kWarpSize + lane;
        if (c < a.lat_dim) out[c] = acc[hh][j];
      }
      if (lane == 0) {
        part_ml(hh)[0] = m[hh];
        part_ml(hh)[1] = l[hh];
      }
    }
  }
}

// ---------------------------------------------------------------- bfloat16 tensor-core path (R = 512, P = 64)
//
// Block (query tile, split), 8 warps: 64 query rows (node, head) = row-major rows of q_lat/q_pe, so one
// node's 64 heads at H = 64, several nodes when H is smaller. Shared memory holds the query tile and two
// cache tiles of 64 rows (ckv | kpe, 576 bf16 = 72 chunks of 16 bytes per row, chunk c of row r stored at
// chunk c ^ (r % 8): ldmatrix conflict-free, no padding), the next tile loaded by cp.async while the current
// one is used. Per tile:
//   S = Q K^T: warp w computes rows 16 (w % 4) .. +16 x tile columns 32 (w / 4) .. +32 (36 k-steps).
//   Online softmax in log2 units: the two warps of a row band exchange their row maxima through shared
//   memory, so both hold the same running max; each keeps the partial row sum of its own columns (summed
//   at the end) and writes P (bf16) to shared memory; alpha per row goes to shared memory.
//   O += P V: V = the tile's ckv part (ldmatrix .trans); warp w owns value columns 64 w .. +64 for all 64
//   rows (128 fp32 accumulators per thread), rescaled by alpha first.
namespace tc {

using bf16 = __nv_bfloat16;
constexpr int kLat = 512;
constexpr int kRope = 64;
constexpr int kDim = kLat + kRope;
constexpr int kChunks = kDim / 8;     // 16-byte chunks per query / cache row
constexpr int kLatChunks = kLat / 8;
constexpr int kRowsQ = 64;            // query rows per block
constexpr int kRowsKv = 64;           // cache rows per tile
constexpr int kPChunks = kRowsKv / 8;
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kValueCols = kLat / kWarps;  // value columns per warp in O += P V
constexpr size_t kTileElems = static_cast<size_t>(kRowsQ) * kDim;
constexpr size_t kSmemBytes = 3 * kTileElems * sizeof(bf16)                  // Q, 2 cache tiles
                              + static_cast<size_t>(kRowsQ) * kRowsKv * sizeof(bf16)  // P
                              + 6 * kRowsQ * sizeof(float);                    // row max x2, alpha, sum x2, max
static_assert(kRowsQ == kRowsKv, "one tile size for the query and cache tiles");
static_assert(kSmemBytes <= 227 * 1024, "over the sm_90 shared memory per block");

// Element offset of 16-byte chunk `chunk` of row `row` in a swizzled tile with `row_chunks` chunks per row
// (a multiple of 8, so the XOR stays within the row).
__device__ __forceinline__ int swz(int row, int chunk, int row_chunks) {
  return (row * row_chunks + (chunk ^ (row & 7))) * 8;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
         (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16);
}

// Rows [row0, row0 + 64) of the [rows, R] and [rows, P] matrices (a query tile or a cache tile) into a
// swizzled tile; rows at or past `end` become zeros (finite for P V).
__device__ __forceinline__ void load_tile(bf16* dst, const bf16* lat, const bf16* rope, int row0, int end) {
  for (int e = threadIdx.x; e < kRowsQ * kChunks; e += kThreads) {
    const int r = e / kChunks;
    const int c = e - r * kChunks;
    const bool ok = row0 + r < end;
    const size_t row = ok ? static_cast<size_t>(row0 + r) : 0;
    const bf16* src = c < kLatChunks ? lat + row * kLat + c * 8 : rope + row * kRope + (c - kLatChunks) * 8;
    cp_async_16(dst + swz(r, c, kChunks), src, ok);
  }
}

__global__ void __launch_bounds__(kThreads, 1) verify_attn_mma_kernel(VerifyAttnArgs<bf16> a) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  extern __shared__ uint4 s_raw[];
  bf16* s_q = reinterpret_cast<bf16*>(s_raw);           // [64, 576] swizzled
  bf16* s_kv_base = s_q + kTileElems;                    // 2 x [64, 576] swizzled
  bf16* s_p = s_kv_base + 2 * kTileElems;                // [64, 64] swizzled
  float* s_max = reinterpret_cast<float*>(s_p + kRowsQ * kRowsKv);  // [2, 64] tile row max per column half
  float* s_alpha = s_max + 2 * kRowsQ;                   // [64]
  float* s_sum = s_alpha + kRowsQ;                       // [2, 64] final row sums per column half
  float* s_mfin = s_sum + 2 * kRowsQ;                    // [64] final row max

  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int g = lane / 4;
  const int q4 = lane % 4;
  const int num_q = a.num_nodes * a.num_heads;
  const int row0 = blockIdx.x * kRowsQ;
  const int split = blockIdx.y;
  const SplitRows rows = split_rows(a, split, kRowsKv);
  const size_t num_nh = static_cast<size_t>(num_q);
  float* part_ml = a.workspace + a.num_splits * num_nh * kLat;  // [splits, N*H, 2] with several splits

  if (rows.begin >= rows.end) {  // a split past the visible rows (only with several splits)
    for (int r = threadIdx.x; r < kRowsQ; r += kThreads) {
      if (row0 + r < num_q) {
        part_ml[2 * (split * num_nh + row0 + r)] = neg_inf();
        part_ml[2 * (split * num_nh + row0 + r) + 1] = 0.0f;
      }
    }
    return;
  }

  load_tile(s_q, a.q_lat, a.q_pe, row0, num_q);
  load_tile(s_kv_base, a.ckv, a.kpe, rows.begin, rows.end);
  cp_async_commit();

  // S phase role: row band mt (16 rows), column half ch (32 tile columns); this thread's rows band + g, +8.
  const int mt = warp % 4;
  const int ch = warp / 4;
  int s_row[2];
  const bool* mask_row[2];
  float m_run[2], l_run[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    s_row[h] = 16 * mt + g + 8 * h;
    const int node = min((row0 + s_row[h]) / a.num_heads, a.num_nodes - 1);  // padding rows: any valid node
    mask_row[h] = a.block_mask + static_cast<size_t>(node) * a.num_nodes;
    m_run[h] = neg_inf();
    l_run[h] = 0.0f;
  }
  const float scale_log2 = a.scale * kLog2e;
  const int visible_all_end = min(rows.prefix, rows.end);  // rows below this need no mask

  float o[4][kValueCols / 8][4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int j = 0; j < kValueCols / 8; ++j) {
#pragma unroll
      for (int k = 0; k < 4; ++k) o[i][j][k] = 0.0f;
    }
  }

  int buf = 0;
  for (int tile = rows.begin; tile < rows.end; tile += kRowsKv, buf ^= 1) {
    cp_async_wait_all();
    __syncthreads();  // this tile is in; every warp is done with the other buffer, s_p and s_alpha
    if (tile + kRowsKv < rows.end) load_tile(s_kv_base + (buf ^ 1) * kTileElems, a.ckv, a.kpe, tile + kRowsKv, rows.end);
    cp_async_commit();
    const bf16* s_kv = s_kv_base + buf * kTileElems;

    // S = Q K^T for rows 16 mt .. +16, tile columns 32 ch .. +32 (4 n-tiles of 8).
    float s[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int k = 0; k < 4; ++k) s[i][k] = 0.0f;
    }
#pragma unroll 4
    for (int ks = 0; ks < kDim / 16; ++ks) {
      uint32_t af[4];
      ldmatrix_x4(af, s_q + swz(16 * mt + lane % 16, 2 * ks + lane / 16, kChunks));
#pragma unroll
      for (int pair = 0; pair < 2; ++pair) {
        const int mi = lane / 8;
        uint32_t bfr[4];
        ldmatrix_x4(bfr, s_kv + swz(32 * ch + 16 * pair + (mi / 2) * 8 + lane % 8, 2 * ks + mi % 2, kChunks));
        mma_bf16_16816(s[2 * pair], af, bfr[0], bfr[1]);
        mma_bf16_16816(s[2 * pair + 1], af, bfr[2], bfr[3]);
      }
    }

    // Scores in log2 units, masked; row maxima of this column half to shared memory.
    const bool needs_mask = tile + kRowsKv > visible_all_end;
    float mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int h = j / 2;
        float v = s[nt][j] * scale_log2;
        if (needs_mask) {
          const int u = tile + 32 * ch + 8 * nt + 2 * q4 + (j & 1);
          const bool visible = u < rows.end && (u < rows.prefix || mask_row[h][u - rows.prefix]);
          if (!visible) v = neg_inf();
        }
        s[nt][j] = v;
        mx[h] = fmaxf(mx[h], v);
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(kFullMask, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(kFullMask, mx[h], 2));
      if (q4 == 0) s_max[ch * kRowsQ + s_row[h]] = mx[h];
    }
    __syncthreads();

    // Online softmax; a row with nothing visible so far keeps p = 0 (no -inf - -inf).
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = s_row[h];
      const float m_new = fmaxf(m_run[h], fmaxf(s_max[row], s_max[kRowsQ + row]));
      const float m_safe = m_new == neg_inf() ? 0.0f : m_new;
      const float alpha = exp2f(m_run[h] - m_safe);
      m_run[h] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const float p0 = exp2f(s[nt][2 * h] - m_safe);
        const float p1 = exp2f(s[nt][2 * h + 1] - m_safe);
        sum += p0 + p1;
        const int col = 32 * ch + 8 * nt + 2 * q4;
        *reinterpret_cast<uint32_t*>(s_p + swz(row, col / 8, kPChunks) + col % 8) = pack_bf16(p0, p1);
      }
      l_run[h] = l_run[h] * alpha + sum;
      if (ch == 0 && q4 == 0) s_alpha[row] = alpha;
    }
    __syncthreads();

    // O = O * alpha + P V for all 64 rows, value columns 64 warp .. +64 (8 n-tiles).
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float alpha_lo = s_alpha[16 * i + g];
      const float alpha_hi = s_alpha[16 * i + g + 8];
#pragma unroll
      for (int j = 0; j < kValueCols / 8; ++j) {
        o[i][j][0] *= alpha_lo;
        o[i][j][1] *= alpha_lo;
        o[i][j][2] *= alpha_hi;
        o[i][j][3] *= alpha_hi;
      }
    }
#pragma unroll
    for (int ks = 0; ks < kRowsKv / 16; ++ks) {
      uint32_t vb[kValueCols / 8][2];
#pragma unroll
      for (int pair = 0; pair < kValueCols / 16; ++pair) {
        const int mi = lane / 8;
        uint32_t r[4];
        ldmatrix_x4_trans(r, s_kv + swz(16 * ks + (mi % 2) * 8 + lane % 8,
                                        warp * (kValueCols / 8) + 2 * pair + mi / 2, kChunks));
        vb[2 * pair][0] = r[0];
        vb[2 * pair][1] = r[1];
        vb[2 * pair + 1][0] = r[2];
        vb[2 * pair + 1][1] = r[3];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        uint32_t pa[4];
        ldmatrix_x4(pa, s_p + swz(16 * i + lane % 16, 2 * ks + lane / 16, kPChunks));
#pragma unroll
        for (int j = 0; j < kValueCols / 8; ++j) mma_bf16_16816(o[i][j], pa, vb[j][0], vb[j][1]);
      }
    }
  }

  // Row sums: across the quad, then the two column halves through shared memory.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = l_run[h];
    l += __shfl_xor_sync(kFullMask, l, 1);
    l += __shfl_xor_sync(kFullMask, l, 2);
    if (q4 == 0) {
      s_sum[ch * kRowsQ + s_row[h]] = l;
      if (ch == 0) s_mfin[s_row[h]] = m_run[h];
    }
  }
  __syncthreads();

#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = 16 * i + g + 8 * h;
      const int qr = row0 + row;
      if (qr >= num_q) continue;
      const float m = s_mfin[row];
      const float l = s_sum[row] + s_sum[kRowsQ + row];
      const bool writes_ml = warp == 0 && q4 == 0;
      if (a.num_splits == 1) {
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        bf16* out = a.o_lat + static_cast<size_t>(qr) * kLat + warp * kValueCols + 2 * q4;
#pragma unroll
        for (int j = 0; j < kValueCols / 8; ++j) {
          *reinterpret_cast<uint32_t*>(out + 8 * j) = pack_bf16(o[i][j][2 * h] * inv, o[i][j][2 * h + 1] * inv);
        }
        if (writes_ml) a.lse[qr] = l > 0.0f ? (m + log2f(l)) * kLn2 : neg_inf();
      } else {
        float* out = a.workspace + (split * num_nh + qr) * kLat + warp * kValueCols + 2 * q4;
#pragma unroll
        for (int j = 0; j < kValueCols / 8; ++j) {
          *reinterpret_cast<float2*>(out + 8 * j) = make_float2(o[i][j][2 * h], o[i][j][2 * h + 1]);
        }
        if (writes_ml) {
          part_ml[2 * (split * num_nh + qr)] = m;
          part_ml[2 * (split * num_nh + qr) + 1] = l;
        }
      }
    }
  }
#endif
}

// Query tiles: 64 rows each.
int num_query_tiles(int num_nodes, int num_heads) { return ceil_div(num_nodes * num_heads, kRowsQ); }

// The shapes and alignment this path handles (the CUDA-core kernel takes everything else).
bool supported(const VerifyAttnArgs<bf16>& a) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (a.lat_dim != kLat || a.rope_dim != kRope || !aligned(a.q_lat) || !aligned(a.q_pe) || !aligned(a.ckv) ||
      !aligned(a.kpe) || !aligned(a.o_lat) || (a.num_splits > 1 && !aligned(a.workspace))) {
    return false;
  }
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return false;
  return major >= 8;  // mma.sync bf16, ldmatrix, cp.async
}

cudaError_t launch(const VerifyAttnArgs<bf16>& a, cudaStream_t stream) {
  DDTREE_CUDA_TRY(allow_dynamic_smem(verify_attn_mma_kernel, kSmemBytes));
  const dim3 grid(num_query_tiles(a.num_nodes, a.num_heads), a.num_splits);
  verify_attn_mma_kernel<<<grid, kThreads, kSmemBytes, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace tc

// Block (node, head): o = sum_s w_s O_s with w_s = 2^(m_s - M) / L, L = sum_s 2^(m_s - M) l_s.
// A split with m_s = -inf saw nothing and may not have written O_s: it is left out of the list of active
// splits, never read. The block's threads are (column group of kVec columns, slice of the active splits):
// with many splits (N = 1: ~128) each thread has only a few independent loads to wait on, and the slices
// are summed through shared memory in a fixed order (deterministic).
template <typename T, int kVec>
__global__ void __launch_bounds__(kMaxCombineThreads) verify_attn_combine_kernel(VerifyAttnArgs<T> a) {
  __shared__ float s_weight[kMaxSplits];
  __shared__ int s_active[kMaxSplits];
  __shared__ int s_num_active;
  __shared__ float s_part[kMaxCombineThreads * kVec];
  const size_t nh = blockIdx.x;
  const size_t num_nh = static_cast<size_t>(a.num_nodes) * a.num_heads;
  const float* part_o = a.workspace;
  const float* part_ml = a.workspace + a.num_splits * num_nh * a.lat_dim;
  if (threadIdx.x < kWarpSize) {
    const int lane = threadIdx.x;
    float m_max = neg_inf();
    for (int s = lane; s < a.num_splits; s += kWarpSize) m_max = fmaxf(m_max, part_ml[2 * (s * num_nh + nh)]);
    for (int offset = 16; offset > 0; offset >>= 1) m_max = fmaxf(m_max, __shfl_xor_sync(kFullMask, m_max, offset));
    float total = 0.0f;
    for (int s = lane; s < a.num_splits; s += kWarpSize) {
      const float m_s = part_ml[2 * (s * num_nh + nh)];
      if (m_s != neg_inf()) total += exp2f(m_s - m_max) * part_ml[2 * (s * num_nh + nh) + 1];
    }
    total = warp_sum(total);
    int count = 0;
    for (int s0 = 0; s0 < a.num_splits; s0 += kWarpSize) {  // every lane runs the same trip count
      const int s = s0 + lane;
      const float m_s = s < a.num_splits ? part_ml[2 * (s * num_nh + nh)] : neg_inf();
      const bool active = m_s != neg_inf() && total > 0.0f;
      const unsigned ballot = __ballot_sync(kFullMask, active);
      if (active) {
        const int k = count + __popc(ballot & ((1u << lane) - 1u));
        s_active[k] = s;
        s_weight[k] = exp2f(m_s - m_max) / total;
      }
      count += __popc(ballot);
    }
    if (lane == 0) {
      s_num_active = count;
      a.lse[nh] = total > 0.0f ? (m_max + log2f(total)) * kLn2 : neg_inf();
    }
  }
  __syncthreads();
  const int num_active = s_num_active;
  const int groups = ceil_div(a.lat_dim, kVec);
  const int slices = blockDim.x / groups;  // combine_threads: >= 1, groups x slices <= kMaxCombineThreads
  const int group = threadIdx.x % groups;
  const int slice = threadIdx.x / groups;
  const int c0 = group * kVec;
  float acc[kVec] = {};
  if (slice < slices) {
#pragma unroll 4
    for (int k = slice; k < num_active; k += slices) {
      const float w = s_weight[k];
      const float* src = part_o + (s_active[k] * num_nh + nh) * a.lat_dim + c0;
      if constexpr (kVec == 4) {
        const float4 v = *reinterpret_cast<const float4*>(src);
        acc[0] = fmaf(w, v.x, acc[0]);
        acc[1] = fmaf(w, v.y, acc[1]);
        acc[2] = fmaf(w, v.z, acc[2]);
        acc[3] = fmaf(w, v.w, acc[3]);
      } else {
        static_assert(kVec == 1);
        if (c0 < a.lat_dim) acc[0] = fmaf(w, src[0], acc[0]);
      }
    }
#pragma unroll
    for (int i = 0; i < kVec; ++i) s_part[(slice * groups + group) * kVec + i] = acc[i];
  }
  __syncthreads();
  if (slice == 0 && c0 < a.lat_dim) {
    float o[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) o[i] = s_part[group * kVec + i];
    for (int sl = 1; sl < slices; ++sl) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) o[i] += s_part[(sl * groups + group) * kVec + i];
    }
#pragma unroll
    for (int i = 0; i < kVec; ++i) a.o_lat[nh * a.lat_dim + c0 + i] = from_float<T>(o[i]);
  }
}

// Combine block size: one thread per (column group, slice of the splits), at most one slice per split.
int combine_threads(int groups, int num_splits) {
  const int slices = std::max(1, std::min(num_splits, kMaxCombineThreads / groups));
  return round_up(groups * slices, kWarpSize);
}

template <typename T>
bool can_vectorize(const VerifyAttnArgs<T>& a) {
  constexpr int vec = 16 / sizeof(T);
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return a.lat_dim % vec == 0 && a.rope_dim % vec == 0 && aligned(a.ckv) && aligned(a.kpe);
}

template <typename T, int kVec>
cudaError_t launch_partial(const VerifyAttnArgs<T>& a, cudaStream_t stream) {
  const int stride = kWarpSize * (ceil_div(a.lat_dim, kWarpSize) + ceil_div(a.rope_dim, kWarpSize));
  const size_t smem = static_cast<size_t>(kTileRows) * stride * sizeof(float);
  const auto kernel = verify_attn_partial_kernel<T, kVec>;
  DDTREE_CUDA_TRY(allow_dynamic_smem(kernel, smem));
  const dim3 grid(a.num_splits, ceil_div(a.num_heads, kHeadsPerBlock), a.num_nodes);
  kernel<<<grid, kThreads, smem, stream>>>(a);
  return cudaGetLastError();
}

// Tensor-core kernel (one block per multiprocessor, all blocks of a launch equally long): the split count
// with the least modelled time, in units of one 64 x 64 tile step of a block. Waves x (tiles per split + 1
// for the query load, pipeline fill and epilogue), plus for several splits the combine kernel (a launch
// and reading the fp32 partial outputs, ~0.14 tile steps per 1000 partial rows). Counts past one wave only
// pay when a wave has few tiles; the smallest count wins ties. Examples, 132 SMs, H = 64: N = 1 -> 64
// splits at S = 4096, 128 at S >= 16384; N = 8 -> 16; N = 32 -> 4; N = 65 -> 2; N >= 129 -> 1.
int tc_num_splits(int num_nodes, int num_heads, int cache_rows, int num_sms) {
  const int64_t tiles = std::max(1, tc::num_query_tiles(num_nodes, num_heads));
  const int kv_tiles = std::max(1, ceil_div(cache_rows, tc::kRowsKv));
  const double partial_rows = static_cast<double>(num_nodes) * num_heads;
  int best = 1;
  double best_cost = 0.0;
  for (int s = 1; s <= std::min(kv_tiles, kMaxSplits); ++s) {
    const int64_t waves = (tiles * s + num_sms - 1) / std::max(1, num_sms);
    double cost = static_cast<double>(waves) * (ceil_div(kv_tiles, s) + 1);
    if (s > 1) cost += 0.2 + 1.37e-4 * s * partial_rows;
    if (s == 1 || cost < best_cost) best = s, best_cost = cost;
  }
  return best;
}

}  // namespace

int VerifyAttnNumSplits(int num_nodes, int num_heads, int cache_rows, int num_sms) {
  // CUDA-core kernel: two waves of 8-head blocks. Tensor-core kernel: tc_num_splits. The larger of the
  // two, so one workspace size serves either path (both are correct for any count up to kMaxSplits).
  const int blocks = num_nodes * ceil_div(num_heads, kHeadsPerBlock);
  const int wanted = ceil_div(2 * num_sms, std::max(1, blocks));
  const int cuda_core = std::min(wanted, ceil_div(cache_rows, kMinSplitRows));
  const int tensor_core = tc_num_splits(num_nodes, num_heads, cache_rows, num_sms);
  return std::clamp(std::max(cuda_core, tensor_core), 1, kMaxSplits);
}

size_t VerifyAttnWorkspaceBytes(int num_nodes, int num_heads, int lat_dim, int num_splits) {
  if (num_splits <= 1) return 0;
  return static_cast<size_t>(num_splits) * num_nodes * num_heads * (lat_dim + 2) * sizeof(float);
}

template <typename T>
cudaError_t VerifyAttn(const VerifyAttnArgs<T>& a, cudaStream_t stream) {
  if (a.lat_dim < 1 || a.lat_dim > kVerifyAttnMaxLatDim || a.rope_dim < 0 || a.rope_dim > kVerifyAttnMaxRopeDim ||
      a.num_nodes > kVerifyAttnMaxNodes || a.num_nodes > a.cache_rows || a.num_splits < 1 ||
      a.num_splits > kMaxSplits || (a.num_splits > 1 && a.workspace == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (a.num_nodes == 0 || a.num_heads == 0) return cudaSuccess;
  constexpr int kVec = 16 / sizeof(T);
  cudaError_t err = cudaSuccess;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if (tc::supported(a)) {
      err = tc::launch(a, stream);
    } else {
      err = can_vectorize(a) ? launch_partial<T, kVec>(a, stream) : launch_partial<T, 1>(a, stream);
    }
  } else {
    err = can_vectorize(a) ? launch_partial<T, kVec>(a, stream) : launch_partial<T, 1>(a, stream);
  }
  if (err != cudaSuccess) return err;
  if (a.num_splits == 1) return cudaSuccess;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const int blocks = a.num_nodes * a.num_heads;
  if (a.lat_dim % 4 == 0 && aligned(a.workspace)) {  // float4 loads of the partial outputs
    verify_attn_combine_kernel<T, 4><<<blocks, combine_threads(a.lat_dim / 4, a.num_splits), 0, stream>>>(a);
  } else {
    verify_attn_combine_kernel<T, 1><<<blocks, combine_threads(a.lat_dim, a.num_splits), 0, stream>>>(a);
  }
  return cudaGetLastError();
}

template cudaError_t VerifyAttn<float>(const VerifyAttnArgs<float>&, cudaStream_t);
template cudaError_t VerifyAttn<__nv_bfloat16>(const VerifyAttnArgs<__nv_bfloat16>&, cudaStream_t);

}  // namespace ddtree::cuda
