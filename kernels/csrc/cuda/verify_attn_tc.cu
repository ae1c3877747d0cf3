// The bfloat16 tensor-core path of verify_attn (R = 512, P = 64); interface: verify_attn_tc.cuh.
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
#include <algorithm>
#include <cstdint>

#include "common.cuh"
#include "verify_attn_mma.cuh"
#include "verify_attn_split.cuh"
#include "verify_attn_tc.cuh"

namespace ddtree::cuda::tc {

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
  const SplitRows rows = tile_split_rows(a, kRowsQ, kRowsKv);
  if (rows.begin >= rows.end) return;

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
    mask_row[h] = tile_mask_row(a, row0 + s_row[h]);
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
          if (!row_visible(rows, mask_row[h], u)) v = neg_inf();
        }
        s[nt][j] = v;
        mx[h] = fmaxf(mx[h], v);
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = quad_max(mx[h]);
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
    const float l = quad_sum(l_run[h]);
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
      const float l = s_sum[row] + s_sum[kRowsQ + row];
#pragma unroll
      for (int j = 0; j < kValueCols / 8; ++j) {
        store_o_pair(a, split, qr, warp * kValueCols + 8 * j + 2 * q4, o[i][j][2 * h], o[i][j][2 * h + 1], l);
      }
      if (warp == 0 && q4 == 0) store_ml(a, split, qr, s_mfin[row], l);
    }
  }
#endif
}

// Query tiles: 64 rows each.
int num_query_tiles(int num_nodes, int num_heads) { return ceil_div(num_nodes * num_heads, kRowsQ); }

// The shapes and alignment this path handles (the CUDA-core kernel takes everything else).
bool supported(const VerifyAttnArgs<bf16>& a) {
  return a.lat_dim == kLat && a.rope_dim == kRope && aligned_16(a.q_lat) && aligned_16(a.q_pe) && aligned_16(a.ckv) &&
         aligned_16(a.kpe) && aligned_16(a.o_lat) && gpu_has_mma_sync();
}

cudaError_t launch(const VerifyAttnArgs<bf16>& a, cudaStream_t stream) {
  DDTREE_CUDA_TRY(allow_dynamic_smem(verify_attn_mma_kernel, kSmemBytes));
  const dim3 grid(num_query_tiles(a.num_nodes, a.num_heads), a.num_splits);
  verify_attn_mma_kernel<<<grid, kThreads, kSmemBytes, stream>>>(a);
  return cudaGetLastError();
}

// One 64 x 64 tile step of a block takes ~4.8 us on the H200 (N = 257, S = 32768: 2 waves x 512 steps in
// 4874 us). 132 SMs, H = 64: N = 1 -> 64 splits at S = 4096; N = 8 -> 16; N = 32 -> 4; N = 65 -> 2; N >= 129 -> 1.
int num_splits(int num_nodes, int num_heads, int cache_rows, int num_sms) {
  return modelled_splits(num_nodes, num_heads, cache_rows, num_sms, 4.8, 1.0);
}

}  // namespace ddtree::cuda::tc
