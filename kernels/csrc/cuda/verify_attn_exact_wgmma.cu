// verify_attn's batch-invariant tensor-core kernel (design: verify_attn_exact_wgmma.cuh). The tile step is the
// fast kernel's (verify_attn_wgmma.cu: warpgroup 0 computes S, the softmax and half of P V, warpgroup 1 loads
// the next tile and computes the other half); what differs is which rows a tile holds and how splits fold.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common.cuh"
#include "verify_attn_exact_fold.cuh"
#include "verify_attn_exact_wgmma.cuh"
#include "verify_attn_mma.cuh"
#include "verify_attn_wgmma.cuh"
#include "verify_attn_wgmma_tile.cuh"
#include "wgmma.cuh"

namespace ddtree::cuda::exact_sm90 {
namespace {

using namespace tc_sm90;  // tile shapes, load_tile, scale_rows
constexpr int kFoldReady = 2;  // named barrier: warpgroup 0 wrote the fold coefficients
constexpr int kRowsReady = 3;  // named barrier over warpgroup 1: the next tile's row map is written
constexpr int kFoldBatch = 32;      // float4s of the state a thread folds at a time
constexpr size_t kExactSmemBytes = 1024 + 3 * size_t{kTileBytes} + kPBytes + 3 * kRows * sizeof(float) +
                                   kRows * sizeof(int);
static_assert(kExactSmemBytes <= 227 * 1024, "over the sm_90 shared memory per block");

// The node's visible block rows in index order, found by one warp reading its mask row 32 entries at a time:
// rows[k - k_lo] = prefix + (the k-th visible index) for k in [k_lo, k_hi). `j` and `count` (the chunk to read
// next and the visible entries before it) carry over to the next call, which asks for the rows after k_hi.
struct Cursor {
  int j = 0, count = 0;
};
__device__ __forceinline__ void find_block_rows(const bool* mask_row, int num_nodes, int prefix, int k_lo, int k_hi,
                                                Cursor& c, int* rows, int lane) {
  while (c.j < num_nodes) {
    const int j = c.j + lane;
    const bool visible = j < num_nodes && mask_row[j];
    const unsigned bits = __ballot_sync(kFullMask, visible);
    const int k = c.count + __popc(bits & ((1u << lane) - 1u));
    if (visible && k >= k_lo && k < k_hi) rows[k - k_lo] = prefix + j;
    const int total = c.count + __popc(bits);
    if (total >= k_hi) return;  // the chunk may hold the next tile's first rows: read it again then
    c.count = total;
    c.j += kWarpSize;
  }
}

// Block (query tile, slot): the tile is heads [64 t, 64 t + 64) of one node, the slot a split (or a group
// when kGroupPerBlock) of its logical positions.
template <bool kGroupPerBlock>
__global__ void __launch_bounds__(kThreads, 1) verify_attn_exact_wgmma_kernel(VerifyAttnExactArgs<bf16> a, int node0) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t s_raw[];
  uint8_t* s_q = s_raw + ((1024 - (smem_addr(s_raw) & 1023)) & 1023);
  uint8_t* s_p = s_q + 3 * kTileBytes;
  float* s_alpha = reinterpret_cast<float*>(s_p + kPBytes);
  float* s_fa = s_alpha + kRows;  // fold coefficients of a row: the state's, the split's
  float* s_fb = s_fa + kRows;
  int* s_rows = reinterpret_cast<int*>(s_fb + kRows);  // the cache rows of the next tile's block positions

  const int group = threadIdx.x / kGroupThreads;
  const int warp = threadIdx.x / kWarpSize % 4;
  const int lane = threadIdx.x % kWarpSize;
  const int q4 = lane % 4;
  const int row_lo = 16 * warp + lane / 4;
  const int tiles_per_node = ceil_div(a.num_heads, kRows);
  const int node = node0 + blockIdx.x / tiles_per_node;
  const int head0 = blockIdx.x % tiles_per_node * kRows;
  const int tile_heads = min(kRows, a.num_heads - head0);
  const int qrow0 = node * a.num_heads + head0;
  const int prefix = clamped_prefix(a);
  const bool* mask_row = a.block_mask + static_cast<size_t>(node) * a.num_nodes;
  const Partials ws = partials(a);
  const size_t ws_row0 = qrow0 - static_cast<size_t>(node0) * a.num_heads;
  float* slot_o = ws.o + (blockIdx.y * ws.num_rows + ws_row0) * kLat;
  float* slot_ml = ws.ml + 2 * (blockIdx.y * ws.num_rows + ws_row0);

  int count = 0;  // the node's visible block rows
  for (int j0 = 0; j0 < a.num_nodes; j0 += kThreads) {
    const int j = j0 + threadIdx.x;
    count += __syncthreads_count(j < a.num_nodes && mask_row[j]);
  }
  const int len = prefix + count;
  const int split_rows = split_rows_for(len, a.split_target);
  const int span = kGroupPerBlock ? kGroupSplits * split_rows : split_rows;  // the block's positions
  const int begin = blockIdx.y * span;
  const int end = min(len, begin + span);
  if (begin >= end) {  // past the node's keys: an empty partial, which the combine step skips
    for (int r = threadIdx.x; r < tile_heads; r += kThreads) {
      slot_ml[2 * r] = neg_inf();
      slot_ml[2 * r + 1] = 0.0f;
    }
    return;
  }

  Cursor cursor;  // warp 0 of warpgroup 1 maps every tile's block positions
  const bool mapper = group == 1 && warp == 0;
  const auto map_rows = [&](int t0) {
    if (t0 + kRows > prefix) {
      find_block_rows(mask_row, a.num_nodes, prefix, max(t0, prefix) - prefix, min(t0 + kRows, len) - prefix, cursor,
                      s_rows, lane);
    }
  };
  const auto row_of = [&](int t0) {
    const int base = max(t0, prefix);
    return [=](int u) { return u < prefix ? u : s_rows[u - base]; };
  };
  if (mapper) map_rows(begin);
  __syncthreads();
  const uint32_t q_addr = smem_addr(s_q);
  load_tile<kThreads>(q_addr, a.q_lat, a.q_pe, qrow0, qrow0 + tile_heads, threadIdx.x);
  load_tile<kThreads>(q_addr + kTileBytes, a.ckv, a.kpe, begin, end, threadIdx.x, row_of(begin));
  cp_async_commit();

  const float scale_log2 = a.scale * kLog2e;
  float m_run[2], l_run[2], m_state[2], l_state[2];  // warpgroup 0: this split's, and the group's folded
  float o[kHalfCols / 2];
  int buf = 0;
  for (int tile = begin; tile < end; tile += kRows, buf ^= 1) {
    const bool split_first = (tile - begin) % split_rows == 0;
    if (split_first) {
#pragma unroll
      for (int h = 0; h < 2; ++h) m_run[h] = neg_inf(), l_run[h] = 0.0f;
#pragma unroll
      for (int i = 0; i < kHalfCols / 2; ++i) o[i] = 0.0f;
    }
    cp_async_wait_all();
    wg::fence_proxy_async();
    __syncthreads();  // this tile is in; both warpgroups are done with the other buffer, P, alpha, the row map
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

      // Every position below `end` is visible (the node's own sequence); s[4j + e] is column 8j + 2 q4 + e % 2.
      const bool needs_mask = tile + kRows > end;
      float mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int h = (i / 2) % 2;
        float v = s[i] * scale_log2;
        if (needs_mask && tile + 8 * (i / 4) + 2 * q4 + i % 2 >= end) v = neg_inf();
        s[i] = v;
        mx[h] = fmaxf(mx[h], v);
      }
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
      if (tile + kRows < end) {  // uniform over the warpgroup
        if (warp == 0) map_rows(tile + kRows);
        wg::barrier_sync(kRowsReady, kGroupThreads);
        load_tile<kGroupThreads>(next_addr, a.ckv, a.kpe, tile + kRows, end, threadIdx.x - kGroupThreads,
                                 row_of(tile + kRows));
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

    const bool split_last = (tile + kRows - begin) % split_rows == 0 || tile + kRows >= end;
    if (!split_last) continue;
    // The split's partial: written out (a block per split), or the group's state (a block per group: its
    // first split's partial, then each later one folded in). Until the group's last split the state sits in
    // this block's slot in a private layout (thread t's float4 k at k * kThreads + t: coalesced, each thread
    // reads back only what it wrote; needs H % 64 == 0, so that the slot's 64 rows are this tile's); the last
    // fold lands in registers and is written row-major, as a block per split writes its partial.
    const bool group_first = tile - begin < split_rows, group_last = tile + kRows >= end;  // uniform
    const bool fold = kGroupPerBlock && !group_first;
    Fold f[2] = {};
    if (group == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float l = quad_sum(l_run[h]);
        if (!fold) {
          m_state[h] = m_run[h], l_state[h] = l;
        } else {
          f[h] = fold_ml(m_state[h], l_state[h], m_run[h], l);
          if (q4 == 0) s_fa[row_lo + 8 * h] = f[h].a, s_fb[row_lo + 8 * h] = f[h].b;
        }
      }
      if (fold) wg::barrier_arrive(kFoldReady, kThreads);
    } else if (fold) {
      wg::barrier_sync(kFoldReady, kThreads);
#pragma unroll
      for (int h = 0; h < 2; ++h) f[h] = {s_fa[row_lo + 8 * h], s_fb[row_lo + 8 * h]};
    }
    // In batches of kFoldBatch float4s: the loads of a batch in flight together, and no more registers
    // than that beside the accumulators (the empty asm keeps the compiler from hoisting later loads).
    float4* state = reinterpret_cast<float4*>(slot_o) + threadIdx.x;
    if (kGroupPerBlock && !group_last) {
#pragma unroll
      for (int k0 = 0; k0 < kHalfCols / 8; k0 += kFoldBatch) {
        float4 st[kFoldBatch];
#pragma unroll
        for (int k = 0; k < kFoldBatch; ++k) st[k] = fold ? state[(k0 + k) * kThreads] : float4{};
#pragma unroll
        for (int k = 0; k < kFoldBatch; ++k) {  // o[4k .. 4k + 3]: rows row_lo (x, y), row_lo + 8 (z, w)
          const int i = 4 * (k0 + k);
          float4 v = make_float4(o[i], o[i + 1], o[i + 2], o[i + 3]);
          if (fold) {
            v = make_float4(fold_o(st[k].x, v.x, f[0]), fold_o(st[k].y, v.y, f[0]), fold_o(st[k].z, v.z, f[1]),
                            fold_o(st[k].w, v.w, f[1]));
          }
          state[(k0 + k) * kThreads] = v;
        }
        asm volatile("" ::: "memory");
      }
      continue;
    }
    if (fold) {
#pragma unroll
      for (int k0 = 0; k0 < kHalfCols / 8; k0 += kFoldBatch) {
        float4 st[kFoldBatch];
#pragma unroll
        for (int k = 0; k < kFoldBatch; ++k) st[k] = state[(k0 + k) * kThreads];
#pragma unroll
        for (int k = 0; k < kFoldBatch; ++k) {
          const int i = 4 * (k0 + k);
          o[i] = fold_o(st[k].x, o[i], f[0]);
          o[i + 1] = fold_o(st[k].y, o[i + 1], f[0]);
          o[i + 2] = fold_o(st[k].z, o[i + 2], f[1]);
          o[i + 3] = fold_o(st[k].w, o[i + 3], f[1]);
        }
        asm volatile("" ::: "memory");
      }
      __syncthreads();  // every private value is read before the row-major writes overwrite them
    }
    let_dependents_launch();  // the combine step (a dependent launch) may take SMs as blocks finish
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row_lo + 8 * h;
      if (row >= tile_heads) continue;
      float* dst = slot_o + row * kLat + group * kHalfCols + 2 * q4;
#pragma unroll
      for (int j = 0; j < kHalfCols / 8; ++j) {
        *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(o[4 * j + 2 * h], o[4 * j + 2 * h + 1]);
      }
      if (group == 0 && q4 == 0) {
        slot_ml[2 * row] = m_state[h];
        slot_ml[2 * row + 1] = l_state[h];
      }
    }
  }
#endif
}

// The chunks of nodes in turn, each its tile kernel then its combine (one workspace, stream-ordered reuse).
template <bool kGroupPerBlock>
cudaError_t launch_kernels(const VerifyAttnExactArgs<bf16>& a, cudaStream_t stream) {
  const auto kernel = verify_attn_exact_wgmma_kernel<kGroupPerBlock>;
  DDTREE_CUDA_TRY(allow_dynamic_smem(kernel, kExactSmemBytes));
  const int slots = num_slots(a.cache_rows, a.split_target, kGroupPerBlock);
  for (int node0 = 0; node0 < a.num_nodes; node0 += a.chunk_nodes) {
    VerifyAttnExactArgs<bf16> chunk = a;
    chunk.chunk_nodes = std::min(a.chunk_nodes, a.num_nodes - node0);
    kernel<<<dim3(chunk.chunk_nodes * ceil_div(a.num_heads, kRows), slots), kThreads, kExactSmemBytes, stream>>>(
        chunk, node0);
    DDTREE_CUDA_TRY(cudaGetLastError());
    DDTREE_CUDA_TRY(launch_combine(chunk, node0, kGroupPerBlock, stream));
  }
  return cudaSuccess;
}

}  // namespace

bool supported(const VerifyAttnExactArgs<bf16>& a) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return a.lat_dim == kLat && a.rope_dim == kRope && aligned(a.q_lat) && aligned(a.q_pe) && aligned(a.ckv) &&
         aligned(a.kpe) && aligned(a.o_lat) && tc_sm90::available();
}

// The modelled time of each way (verify_attn_split.cuh's model: waves x (tiles per block + 5) x 1.8 us, plus
// the combine's ~1.2 ns per partial row it reads); a block per group also pays ~3 tiles per fold of its state
// (fitted to both ways timed at 13 shapes on the H200, N = 1 to 257, S = 1024 to 32768: the model's pick is
// within 4% of the faster way at each, where a fold of half a tile had picked groups 13-16% slower at 512
// split blocks, e.g. N = 8, S = 16384).
// The rows' lengths are modelled as cache_rows.
bool group_per_block(int num_nodes, int num_heads, int cache_rows, int split_target, int num_sms) {
  if (num_heads % kRows != 0) return false;  // the private state layout needs whole 64-head tiles
  const double tiles = static_cast<double>(num_nodes) * ceil_div(num_heads, kRows);
  const double rows = static_cast<double>(num_nodes) * num_heads;
  const int split_rows = split_rows_for(cache_rows, split_target);
  const auto us = [&](int span) {
    const int slots = ceil_div(cache_rows, span);
    const int splits = ceil_div(std::min(cache_rows, span), split_rows);  // folded into a block's state
    const double waves = std::ceil(tiles * slots / std::max(1, num_sms));
    const double tiles_per_block = ceil_div(std::min(cache_rows, span), kRows) + 3.0 * (splits - 1);
    return waves * (tiles_per_block + 5.0) * 1.8 + 1.2e-3 * slots * rows;
  };
  return us(kGroupSplits * split_rows) < us(split_rows);
}

size_t workspace_bytes(int num_nodes, int num_heads, int cache_rows, int split_target, bool group_per_block) {
  return static_cast<size_t>(num_slots(cache_rows, split_target, group_per_block)) * num_nodes * num_heads *
         (kLat + 2) * sizeof(float);
}

int chunk_nodes(int num_nodes, int num_heads, int cache_rows, int split_target, bool group_per_block) {
  const size_t per_node = workspace_bytes(1, num_heads, cache_rows, split_target, group_per_block);
  return static_cast<int>(std::clamp<size_t>(kMaxWorkspaceBytes / std::max<size_t>(per_node, 1), 1,
                                             std::max(num_nodes, 1)));
}

cudaError_t launch(const VerifyAttnExactArgs<bf16>& a, cudaStream_t stream) {
  if (a.num_nodes == 0 || a.num_heads == 0) return cudaSuccess;
  if (a.workspace == nullptr || a.lat_dim != kLat || a.rope_dim != kRope || a.chunk_nodes < 1 ||
      a.split_target < 1 || a.split_target > kMaxSplitTarget) {
    return cudaErrorInvalidValue;
  }
  if (a.group_per_block && a.num_heads % kRows != 0) return cudaErrorInvalidValue;
  return a.group_per_block ? launch_kernels<true>(a, stream) : launch_kernels<false>(a, stream);
}

}  // namespace ddtree::cuda::exact_sm90
