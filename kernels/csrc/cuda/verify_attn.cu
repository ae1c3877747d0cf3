// Split-KV absorbed-MLA attention: the CUDA-core kernel, the combine step and the dispatch (design:
// verify_attn.cuh; the bfloat16 tensor-core path: verify_attn_tc.cu).
#include <algorithm>
#include <type_traits>

#include "common.cuh"
#include "verify_attn.cuh"
#include "verify_attn_split.cuh"
#include "verify_attn_tc.cuh"
#include "verify_attn_wgmma.cuh"

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
constexpr int kMinSplitRows = 256;
constexpr int kMaxCombineThreads = 1024;
static_assert(kMaxCombineThreads >= kVerifyAttnMaxLatDim, "one combine thread per column at least");


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

  if (rows.begin >= rows.end) {  // a split past the visible rows (only with several splits)
#pragma unroll
    for (int hh = 0; hh < kHeadsPerWarp; ++hh) {
      if (head_ok[hh] && lane == 0) store_ml(a, blockIdx.x, nh_index(hh), neg_inf(), 0.0f);
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
    const float inv = a.num_splits == 1 && l[hh] > 0.0f ? 1.0f / l[hh] : 1.0f;  // several splits: unnormalised
#pragma unroll
    for (int j = 0; j < kMaxLatChunks; ++j) {
      const int c = j * kWarpSize + lane;
      if (c >= a.lat_dim) continue;
      if (a.num_splits == 1) {
        a.o_lat[nh_index(hh) * a.lat_dim + c] = from_float<T>(acc[hh][j] * inv);
      } else {
        partial_o(a, blockIdx.x, nh_index(hh))[c] = acc[hh][j];
      }
    }
    if (lane == 0) store_ml(a, blockIdx.x, nh_index(hh), m[hh], l[hh]);
  }
}


// Block (node, head, chunk of the columns): o = sum_s w_s O_s with w_s = 2^(m_s - M) / L, L = sum_s 2^(m_s - M) l_s.
// A split with m_s = -inf saw nothing and may not have written O_s: it is left out of the list of active
// splits, never read. Warp 0 reads every split's (m, l) once (all loads in flight together, kept in
// registers) and writes the active splits and their weights to shared memory; then the block's threads,
// (column group of kVec columns in the block's chunk, slice of the active splits), each sum their few
// independent loads and the slices are added through shared memory in a fixed order (deterministic).
template <typename T, int kVec>
__global__ void __launch_bounds__(kMaxCombineThreads) verify_attn_combine_kernel(VerifyAttnArgs<T> a) {
  constexpr int kPerLane = kMaxSplits / kWarpSize;
  __shared__ float s_weight[kMaxSplits];
  __shared__ int s_active[kMaxSplits];
  __shared__ int s_num_active;
  __shared__ float s_part[kMaxCombineThreads * kVec];
  const size_t nh = blockIdx.x;
  wait_for_previous_grid();  // the splits' partial results
  if (threadIdx.x < kWarpSize) {
    const int lane = threadIdx.x;
    float m[kPerLane], l[kPerLane];
    float m_max = neg_inf();
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int split = lane + kWarpSize * i;
      m[i] = neg_inf();
      l[i] = 0.0f;
      if (split < a.num_splits) {
        const float* ml = partial_ml(a, split, nh);
        m[i] = ml[0];
        l[i] = ml[1];
      }
      m_max = fmaxf(m_max, m[i]);
    }
    for (int offset = 16; offset > 0; offset >>= 1) m_max = fmaxf(m_max, __shfl_xor_sync(kFullMask, m_max, offset));
    float total = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      if (m[i] != neg_inf()) total += exp2f(m[i] - m_max) * l[i];
    }
    total = warp_sum(total);
    int count = 0;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {  // every lane runs the same trip count
      const bool active = m[i] != neg_inf() && total > 0.0f;
      const unsigned ballot = __ballot_sync(kFullMask, active);
      if (active) {
        const int k = count + __popc(ballot & ((1u << lane) - 1u));
        s_active[k] = lane + kWarpSize * i;
        s_weight[k] = exp2f(m[i] - m_max) / total;
      }
      count += __popc(ballot);
    }
    if (lane == 0) {
      s_num_active = count;
      if (blockIdx.y == 0) a.lse[nh] = total > 0.0f ? (m_max + log2f(total)) * kLn2 : neg_inf();
    }
  }
  __syncthreads();
  const int num_active = s_num_active;
  const int groups = ceil_div(ceil_div(a.lat_dim, kVec), gridDim.y);  // column groups of this block's chunk
  const int slices = blockDim.x / groups;  // combine_shape: >= 1, groups x slices <= kMaxCombineThreads
  const int group = threadIdx.x % groups;
  const int slice = threadIdx.x / groups;
  const int c0 = (blockIdx.y * groups + group) * kVec;
  float acc[kVec] = {};
  if (slice < slices && c0 < a.lat_dim) {
#pragma unroll 4
    for (int k = slice; k < num_active; k += slices) {
      const float w = s_weight[k];
      const float* src = partial_o(a, s_active[k], nh) + c0;
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

// Combine grid and block shape. Few rows (N = 1: 64 rows, ~128 splits) cut their columns into chunks of a warp's
// width or more, until there are two blocks per multiprocessor (one block per row left half the GPU idle, each
// reading 256 KB alone); each block has one thread per (column group of its chunk, slice of the splits), at most
// one slice per split, and only as many slices as it takes to give the GPU ~1024 threads per multiprocessor over
// all blocks: many rows (a tree) take one chunk and one slice each, small blocks and many resident.
struct CombineShape {
  int chunks;
  int threads;
};

CombineShape combine_shape(int groups, int num_splits, int num_rows, int num_sms) {
  const int chunks = std::clamp(ceil_div(2 * num_sms, std::max(1, num_rows)), 1, std::max(1, groups / kWarpSize));
  const int chunk_groups = ceil_div(groups, chunks);
  const int64_t wanted = ceil_div(1024 * num_sms, std::max(1, num_rows * chunks * chunk_groups));
  const int64_t slices = std::clamp<int64_t>(wanted, 1, std::min(num_splits, kMaxCombineThreads / chunk_groups));
  return {chunks, round_up(chunk_groups * static_cast<int>(slices), kWarpSize)};
}

template <typename T, int kVec>
cudaError_t launch_combine(const VerifyAttnArgs<T>& a, cudaStream_t stream) {
  // A dependent launch: the combine's blocks are placed while the splits finish, and wait for them.
  const int rows = a.num_nodes * a.num_heads;
  const CombineShape shape = combine_shape(ceil_div(a.lat_dim, kVec), a.num_splits, rows, a.num_sms);
  return launch_dependent(verify_attn_combine_kernel<T, kVec>, dim3(rows, shape.chunks), shape.threads, 0, stream, a);
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


}  // namespace

int VerifyAttnNumSplits(VerifyAttnKernel kernel, int num_nodes, int num_heads, int cache_rows, int num_sms,
                        int wanted) {
  if (wanted != 0) return std::clamp(wanted, 1, kMaxSplits);
  switch (kernel) {
    case VerifyAttnKernel::kWgmma:  // modelled_splits: within [1, kMaxSplits]
      return tc_sm90::num_splits(num_nodes, num_heads, cache_rows, num_sms);
    case VerifyAttnKernel::kMmaSync:
      return tc::num_splits(num_nodes, num_heads, cache_rows, num_sms);
    default: {  // two waves of 8-head blocks
      const int blocks = num_nodes * ceil_div(num_heads, kHeadsPerBlock);
      const int wanted_splits = ceil_div(2 * num_sms, std::max(1, blocks));
      return std::clamp(std::min(wanted_splits, ceil_div(cache_rows, kMinSplitRows)), 1, kMaxSplits);
    }
  }
}

template <typename T>
VerifyAttnKernel VerifyAttnResolveKernel(const VerifyAttnArgs<T>& a, VerifyAttnKernel wanted) {
  const auto handles = [&](VerifyAttnKernel kernel) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      if (kernel == VerifyAttnKernel::kWgmma) return tc_sm90::supported(a);
      if (kernel == VerifyAttnKernel::kMmaSync) return tc::supported(a);
    }
    return kernel == VerifyAttnKernel::kCudaCore;
  };
  if (wanted != VerifyAttnKernel::kAuto) return handles(wanted) ? wanted : VerifyAttnKernel::kAuto;
  for (const VerifyAttnKernel kernel : {VerifyAttnKernel::kWgmma, VerifyAttnKernel::kMmaSync}) {
    if (handles(kernel)) return kernel;
  }
  return VerifyAttnKernel::kCudaCore;
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
  if (a.kernel == VerifyAttnKernel::kAuto) return cudaErrorInvalidValue;  // the caller resolves it, once
  constexpr int kVec = 16 / sizeof(T);
  cudaError_t err = cudaSuccess;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if (a.kernel == VerifyAttnKernel::kWgmma) err = tc_sm90::launch(a, stream);
    if (a.kernel == VerifyAttnKernel::kMmaSync) err = tc::launch(a, stream);
  }
  if (a.kernel == VerifyAttnKernel::kCudaCore) {
    err = can_vectorize(a) ? launch_partial<T, kVec>(a, stream) : launch_partial<T, 1>(a, stream);
  }
  if (err != cudaSuccess) return err;
  if (a.num_splits == 1) return cudaSuccess;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (a.lat_dim % 4 == 0 && aligned(a.workspace)) return launch_combine<T, 4>(a, stream);  // float4 loads
  return launch_combine<T, 1>(a, stream);
}

template VerifyAttnKernel VerifyAttnResolveKernel<float>(const VerifyAttnArgs<float>&, VerifyAttnKernel);
template VerifyAttnKernel VerifyAttnResolveKernel<__nv_bfloat16>(const VerifyAttnArgs<__nv_bfloat16>&,
                                                                 VerifyAttnKernel);
template cudaError_t VerifyAttn<float>(const VerifyAttnArgs<float>&, cudaStream_t);
template cudaError_t VerifyAttn<__nv_bfloat16>(const VerifyAttnArgs<__nv_bfloat16>&, cudaStream_t);

}  // namespace ddtree::cuda
