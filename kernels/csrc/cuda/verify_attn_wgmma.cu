// The sm_90a tensor-core path of verify_attn (R = 512, P = 64); interface: verify_attn_wgmma.cuh.
//
// Block (query tile, split), two warpgroups (256 threads): 64 query rows (node, head), as on the mma.sync
// path, and cache tiles of 64 rows streamed through two shared-memory buffers by cp.async (the next tile
// loads while the current one is used). Shared memory holds every operand in the 128-byte-swizzled layout
// the wgmma descriptors read (wgmma.cuh): a [64, 576] tile is 9 atoms of 64 columns, atom a at 8192 a bytes,
// row r of an atom at 128 r, its 16-byte chunk c at chunk c ^ (r % 8).
// Per cache tile:
//   warpgroup 0: S = Q K^T (64 x 64, 36 k-steps of m64n64k16, both operands K-major from shared memory),
//     the mask, the online softmax in log2 units (a row's 64 scores sit in one quad of threads: two
//     shuffles), P to shared memory for warpgroup 1, then O[:, 0:256] = O * alpha + P V with P straight
//     from its registers (the score accumulator layout is the A operand layout).
//   warpgroup 1: waits on a named barrier for P and alpha, O[:, 256:512] = O * alpha + P V (P from shared
//     memory).
// Warpgroup 1 also issues the cp.async loads of the next tile while warpgroup 0 computes S.
// V is the tile's ckv part read N-major (no transpose pass). Three barriers per tile: the tile is in (all),
// P is ready (named, warpgroup 1 waits), and the next tile's top barrier, which also keeps P, alpha and the
// other buffer from being rewritten while a warpgroup still reads them.
#include <algorithm>
#include <cstdint>

#include "common.cuh"
#include "verify_attn_mma.cuh"
#include "verify_attn_split.cuh"
#include "verify_attn_wgmma.cuh"
#include "verify_attn_wgmma_tile.cuh"
#include "wgmma.cuh"

namespace ddtree::cuda::tc_sm90 {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The end of a block's rows trimmed past the last block row any node of its query tile sees: a tree node sees
// no block row after itself, a causal row none after its own, so a large tree or a prefill skips those tiles.
// A split keeps at least its first row: one that sees nothing still runs its masked tile and writes what a row
// that saw nothing writes.
__device__ int trimmed_end(const VerifyAttnArgs<bf16>& a, const SplitRows& rows, int row0) {
  __shared__ int s_last;
  if (threadIdx.x == 0) s_last = -1;
  __syncthreads();
  const int first_node = row0 / a.num_heads;
  const int last_node = min(a.num_nodes - 1, (row0 + kRows - 1) / a.num_heads);
  int last = -1;
  for (int node = first_node; node <= last_node; ++node) {
    const bool* mask_row = a.block_mask + static_cast<size_t>(node) * a.num_nodes;
    for (int j = threadIdx.x; j < a.num_nodes; j += kThreads) last = mask_row[j] ? max(last, j) : last;
  }
  if (last >= 0) atomicMax(&s_last, last);
  __syncthreads();
  return max(rows.begin + 1, min(rows.end, rows.prefix + s_last + 1));
}
#endif

__global__ void __launch_bounds__(kThreads, 1) verify_attn_wgmma_kernel(VerifyAttnArgs<bf16> a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t s_raw[];
  uint8_t* s_q = s_raw + ((1024 - (smem_addr(s_raw) & 1023)) & 1023);
  uint8_t* s_p = s_q + 3 * kTileBytes;  // after Q and the 2 cache tile buffers
  float* s_alpha = reinterpret_cast<float*>(s_p + kPBytes);
  float* s_sum = s_alpha + kRows;
  float* s_max = s_sum + kRows;

  const int group = threadIdx.x / kGroupThreads;
  const int warp = threadIdx.x / kWarpSize % 4;  // within the warpgroup
  const int lane = threadIdx.x % kWarpSize;
  const int q4 = lane % 4;
  const int row_lo = 16 * warp + lane / 4;  // this thread's accumulator rows: row_lo, row_lo + 8
  const int num_q = a.num_nodes * a.num_heads;
  const int row0 = blockIdx.x * kRows;
  const int split = blockIdx.y;
  SplitRows rows = tile_split_rows(a, kRows, kRows);
  if (rows.begin >= rows.end) return;

  const uint32_t q_addr = smem_addr(s_q);
  load_tile<kThreads>(q_addr, a.q_lat, a.q_pe, row0, num_q, threadIdx.x);
  load_tile<kThreads>(q_addr + kTileBytes, a.ckv, a.kpe, rows.begin, rows.end, threadIdx.x);
  cp_async_commit();
  if (a.num_nodes > 1) rows.end = trimmed_end(a, rows, row0);  // while the first tile loads

  const bool* mask_row[2];
  float m_run[2], l_run[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mask_row[h] = tile_mask_row(a, row0 + row_lo + 8 * h);
    m_run[h] = neg_inf();
    l_run[h] = 0.0f;
  }
  const float scale_log2 = a.scale * kLog2e;
  const int visible_all_end = min(rows.prefix, rows.end);  // rows below this need no mask

  float o[kHalfCols / 2];  // O[:, 256 group + ...] in the m64n256 accumulator layout
#pragma unroll
  for (int i = 0; i < kHalfCols / 2; ++i) o[i] = 0.0f;

  int buf = 0;
  for (int tile = rows.begin; tile < rows.end; tile += kRows, buf ^= 1) {
    cp_async_wait_all();
    wg::fence_proxy_async();
    __syncthreads();  // this tile is in; both warpgroups are done with the other buffer, P and alpha
    const uint32_t kv_addr = q_addr + (1 + buf) * kTileBytes;
    const uint32_t next_addr = q_addr + (2 - buf) * kTileBytes;
    const uint64_t v_desc = wg::smem_desc(kv_addr + group * (kHalfCols / 64) * kAtomBytes, kAtomBytes, kGroupBytes);

    if (group == 0) {
      float s[32];
#pragma unroll
      for (int i = 0; i < 32; ++i) s[i] = 0.0f;
      wg::fence_operands(s);
      const uint64_t q_desc = wg::smem_desc(q_addr, 16, kGroupBytes);
      const uint64_t k_desc = wg::smem_desc(kv_addr, 16, kGroupBytes);
      wg::fence();
#pragma unroll
      for (int ks = 0; ks < kDim / 16; ++ks) {
        const uint32_t off = (ks / 4) * kAtomBytes + (ks % 4) * kKStepBytes;
        wg::mma_m64n64k16_ss(s, wg::desc_advance(q_desc, off), wg::desc_advance(k_desc, off), 1);
      }
      wg::commit();
      wg::wait_all();
      wg::fence_operands(s);

      // Scores in log2 units, masked; s[4j + e] is row row_lo + 8 (e / 2), column 8j + 2 q4 + e % 2.
      const bool needs_mask = tile + kRows > visible_all_end;
      float mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int h = (i / 2) % 2;
        float v = s[i] * scale_log2;
        if (needs_mask) {
          const int u = tile + 8 * (i / 4) + 2 * q4 + i % 2;
          if (!row_visible(rows, mask_row[h], u)) v = neg_inf();
        }
        s[i] = v;
        mx[h] = fmaxf(mx[h], v);
      }
      // Online softmax; a row with nothing visible so far keeps p = 0 (no -inf - -inf).
      float m_safe[2], alpha[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mx[h] = quad_max(mx[h]);
        const float m_new = fmaxf(m_run[h], mx[h]);
        m_safe[h] = m_new == neg_inf() ? 0.0f : m_new;
        alpha[h] = exp2f(m_run[h] - m_safe[h]);
        m_run[h] = m_new;
        l_run[h] *= alpha[h];
      }
      // P as bf16 pairs: p_frag[k] holds s[2k], s[2k + 1] (row row_lo + 8 (k % 2), columns 8 (k / 2) + 2 q4),
      // so p_frag[4t .. 4t + 3] is the A operand of k-step t.
      uint32_t p_frag[16];
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        const int h = k % 2;
        const float p0 = exp2f(s[2 * k] - m_safe[h]);
        const float p1 = exp2f(s[2 * k + 1] - m_safe[h]);
        l_run[h] += p0 + p1;
        p_frag[k] = pack_bf16(p0, p1);
        const int row = row_lo + 8 * h;
        *reinterpret_cast<uint32_t*>(s_p + row * 128 + (((k / 2) ^ (row % 8)) << 4) + 4 * q4) = p_frag[k];
      }
      if (q4 == 0) {
        s_alpha[row_lo] = alpha[0];
        s_alpha[row_lo + 8] = alpha[1];
      }
      wg::fence_proxy_async();
      wg::barrier_arrive(kPReady, kThreads);

      scale_rows(o, alpha[0], alpha[1]);
      wg::fence_operands(o);
      wg::fence_operands(p_frag);
      wg::fence();
#pragma unroll
      for (int t = 0; t < kRows / 16; ++t) {
        const uint32_t a_frag[4] = {p_frag[4 * t], p_frag[4 * t + 1], p_frag[4 * t + 2], p_frag[4 * t + 3]};
        wg::mma_m64n256k16_rs_bt(o, a_frag, wg::desc_advance(v_desc, t * kVStepBytes), 1);
      }
      wg::commit();
      wg::wait_all();
      wg::fence_operands(o);
    } else {
      // Warpgroup 1 loads the next tile while warpgroup 0 computes S.
      if (tile + kRows < rows.end) {
        load_tile<kGroupThreads>(next_addr, a.ckv, a.kpe, tile + kRows, rows.end, threadIdx.x - kGroupThreads);
      }
      cp_async_commit();
      wg::barrier_sync(kPReady, kThreads);
      scale_rows(o, s_alpha[row_lo], s_alpha[row_lo + 8]);
      wg::fence_operands(o);
      const uint64_t p_desc = wg::smem_desc(smem_addr(s_p), 16, kGroupBytes);
      wg::fence();
#pragma unroll
      for (int t = 0; t < kRows / 16; ++t) {
        wg::mma_m64n256k16_ss_bt(o, wg::desc_advance(p_desc, t * kKStepBytes), wg::desc_advance(v_desc, t * kVStepBytes), 1);
      }
      wg::commit();
      wg::wait_all();
      wg::fence_operands(o);
    }
  }

  // Row sums (warpgroup 0 holds them, a quad per row) and maxima to shared memory for both warpgroups.
  if (group == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float l = quad_sum(l_run[h]);
      if (q4 == 0) {
        s_sum[row_lo + 8 * h] = l;
        s_max[row_lo + 8 * h] = m_run[h];
      }
    }
  }
  let_dependents_launch();  // the combine step (a dependent launch) may take SMs as blocks finish
  __syncthreads();

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row_lo + 8 * h;
    const int qr = row0 + row;
    if (qr >= num_q) continue;
    const float l = s_sum[row];
#pragma unroll
    for (int j = 0; j < kHalfCols / 8; ++j) {
      store_o_pair(a, split, qr, group * kHalfCols + 8 * j + 2 * q4, o[4 * j + 2 * h], o[4 * j + 2 * h + 1], l);
    }
    if (group == 0 && q4 == 0) store_ml(a, split, qr, s_max[row], l);
  }
#endif
}

bool available() {
#if defined(DDTREE_SM90A)
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) return false;
  return major == 9 && minor == 0;
#else
  return false;
#endif
}

bool supported(const VerifyAttnArgs<bf16>& a) {
  const auto aligned = [](const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; };
  return a.lat_dim == kLat && a.rope_dim == kRope && aligned(a.q_lat, 16) && aligned(a.q_pe, 16) &&
         aligned(a.ckv, 16) && aligned(a.kpe, 16) && aligned(a.o_lat, 4) && available();
}

// One 64 x 64 tile step of a block takes ~1.8 us on the H200 (N = 257, S = 32768: 2 waves x 512 steps in
// 1836 us, 640 TFLOP/s), and a launch ~5 steps more (N = 8: 8.9 us at 0 steps, extrapolated from S = 256 .. 4096).
int num_splits(int num_nodes, int num_heads, int cache_rows, int num_sms) {
  return modelled_splits(num_nodes, num_heads, cache_rows, num_sms, 1.8, 5.0);
}

cudaError_t launch(const VerifyAttnArgs<bf16>& a, cudaStream_t stream) {
  DDTREE_CUDA_TRY(allow_dynamic_smem(verify_attn_wgmma_kernel, kSmemBytes));
  const dim3 grid(ceil_div(a.num_nodes * a.num_heads, kRows), a.num_splits);
  verify_attn_wgmma_kernel<<<grid, kThreads, kSmemBytes, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace ddtree::cuda::tc_sm90
