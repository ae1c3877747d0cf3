// The per-row math of rms_norm_rows and head_norm_rope, shared with latent_write so that its rows are those ops' bits:
// one block's RMSNorm of a row (rms_norm_rows.cuh has the reduction order) and one warp's norm and RoPE of a head
// (head_norm_rope.cuh has the layout). Device code only: included by the .cu files, never by the binding.
#pragma once

#include <cstdint>

#include "common.cuh"
#include "head_norm_rope.cuh"

namespace ddtree::cuda {

constexpr int kRowNormThreads = 256;  // the block that norms a row; its fold below is part of the row's bits

// Where D is a multiple of a 16-byte vector, thread t adds the squares of vectors t, t + 256, ... in element order
// (its loads independent and in flight together: a row of 7168 bf16 is 3.5 loads a thread, not 28 serial ones),
// loading each vector whole when the row is 16-byte aligned and element by element when not, in the same order;
// else columns t, t + 256, ... So the order depends on D alone.
template <typename T>
struct alignas(16) Vec {
  static constexpr int kSize = 16 / sizeof(T);
  T v[kSize];
};

template <typename T>
__device__ __forceinline__ Vec<T> load_vec(const T* row, int c, bool aligned) {
  if (aligned) return reinterpret_cast<const Vec<T>*>(row)[c];
  Vec<T> out;
#pragma unroll
  for (int i = 0; i < Vec<T>::kSize; ++i) out.v[i] = row[c * Vec<T>::kSize + i];
  return out;
}

// The block's shared memory for rms_norm_row: one sum per warp, then the row's scale.
struct RowNormShared {
  float warp_sums[kRowNormThreads / kWarpSize];
  float scale;
};

// The block's reduction of its threads' squares (each thread's in its columns' order): a warp butterfly, then thread 0
// over the warps' sums in warp order. Every thread of the block calls it (two barriers) and gets the row's scale.
__device__ __forceinline__ float row_scale(float squares, int width, float eps, RowNormShared& shared) {
  squares = warp_sum(squares);
  if (threadIdx.x % kWarpSize == 0) shared.warp_sums[threadIdx.x / kWarpSize] = squares;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int w = 0; w < kRowNormThreads / kWarpSize; ++w) total += shared.warp_sums[w];
    shared.scale = rsqrtf(total / static_cast<float>(width) + eps);
  }
  __syncthreads();
  return shared.scale;
}

// A thread's vectors t, t + 256, ... of a row held in registers, for rows of at most kHeldVectors * 256 vectors (8,192
// bf16 or 4,096 float32 values: Kimi-K2's and DeepSeek-V3's hidden width): the row is read once, not once for its
// squares and again for its output, which halves the round trips of a one-row launch.
constexpr int kHeldVectors = 4;

template <typename T>
struct HeldRow {
  Vec<T> chunk[kHeldVectors];

  __device__ __forceinline__ static bool fits(int width) {
    return width % Vec<T>::kSize == 0 && width / Vec<T>::kSize <= kHeldVectors * kRowNormThreads;
  }
  __device__ __forceinline__ static int column(int j) { return threadIdx.x + j * kRowNormThreads; }
};

// y = held * rsqrt(mean(held^2) + eps) * weight for a row held in registers (HeldRow::fits): the same squares in the
// same order, and the same products, as rms_norm_row's reloading path, so the same bits.
template <typename T, typename W>
__device__ __forceinline__ void norm_held_row(const HeldRow<T>& held, const W* weight, T* y, int width, float eps,
                                              RowNormShared& shared) {
  constexpr int kVec = Vec<T>::kSize;
  const int vectors = width / kVec;
  const bool aligned = reinterpret_cast<uintptr_t>(y) % 16 == 0;
  float squares = 0.0f;
  float w[kHeldVectors][kVec];  // loaded before the reduction, so the output waits on no load
#pragma unroll
  for (int j = 0; j < kHeldVectors; ++j) {
    const int c = HeldRow<T>::column(j);
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      w[j][i] = c < vectors ? to_float(weight[c * kVec + i]) : 0.0f;
      if (c < vectors) {
        const float v = to_float(held.chunk[j].v[i]);
        squares = fmaf(v, v, squares);
      }
    }
  }
  const float scale = row_scale(squares, width, eps, shared);
#pragma unroll
  for (int j = 0; j < kHeldVectors; ++j) {
    const int c = HeldRow<T>::column(j);
    if (c >= vectors) break;
    Vec<T> out;
#pragma unroll
    for (int i = 0; i < kVec; ++i) out.v[i] = from_float<T>(to_float(held.chunk[j].v[i]) * scale * w[j][i]);
    if (aligned) {
      reinterpret_cast<Vec<T>*>(y)[c] = out;
    } else {
#pragma unroll
      for (int i = 0; i < kVec; ++i) y[c * kVec + i] = out.v[i];
    }
  }
}

// y = row * rsqrt(mean(row^2) + eps) * weight, D = width values, in float32, rounded to T once. Every thread of a
// block of kRowNormThreads calls it (it holds two barriers): each thread's squares in its columns' order, then
// row_scale. A row that fits is held in registers (norm_held_row), a wider one read twice.
template <typename T, typename W>
__device__ __forceinline__ void rms_norm_row(const T* row, const W* weight, T* y, int width, float eps,
                                             RowNormShared& shared) {
  constexpr int kVec = Vec<T>::kSize;
  const bool chunked = width % kVec == 0;
  const bool aligned = reinterpret_cast<uintptr_t>(row) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0;
  if (HeldRow<T>::fits(width)) {
    HeldRow<T> held;
#pragma unroll
    for (int j = 0; j < kHeldVectors; ++j) {
      const int c = HeldRow<T>::column(j);
      if (c < width / kVec) held.chunk[j] = load_vec(row, c, aligned);
    }
    norm_held_row<T, W>(held, weight, y, width, eps, shared);
    return;
  }
  float squares = 0.0f;
  if (chunked) {
#pragma unroll 4
    for (int c = threadIdx.x; c < width / kVec; c += kRowNormThreads) {
      const Vec<T> chunk = load_vec(row, c, aligned);
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const float v = to_float(chunk.v[i]);
        squares = fmaf(v, v, squares);
      }
    }
  } else {
    for (int d = threadIdx.x; d < width; d += kRowNormThreads) {
      const float v = to_float(row[d]);
      squares = fmaf(v, v, squares);
    }
  }
  const float scale = row_scale(squares, width, eps, shared);
  if (chunked) {
#pragma unroll 4
    for (int c = threadIdx.x; c < width / kVec; c += kRowNormThreads) {
      const Vec<T> chunk = load_vec(row, c, aligned);
      Vec<T> out;
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        out.v[i] = from_float<T>(to_float(chunk.v[i]) * scale * to_float(weight[c * kVec + i]));
      }
      if (aligned) {
        reinterpret_cast<Vec<T>*>(y)[c] = out;
      } else {
#pragma unroll
        for (int i = 0; i < kVec; ++i) y[c * kVec + i] = out.v[i];
      }
    }
  } else {
    for (int d = threadIdx.x; d < width; d += kRowNormThreads) {
      y[d] = from_float<T>(to_float(row[d]) * scale * to_float(weight[d]));
    }
  }
}

constexpr int kHeadMaxPairs = kHeadNormRopeMaxDim / 2 / kWarpSize;

// One head of D = head_dim values (contiguous) normed by weight [D] (nullptr: no norm) and turned by the angles cos,
// sin [D/2], into y [D]; the 32 lanes of a warp call it (the norm is one warp reduction). Lane l holds the pairs
// (j, j + D/2) (interleaved: (2j, 2j + 1)) for j = l, l + 32, ...; pair j's turned values go to dims j and j + D/2.
template <typename T, typename W>
__device__ __forceinline__ void norm_rope_head(const T* x, const W* weight, const float* cos, const float* sin, T* y,
                                               int head_dim, float eps, bool interleave, int lane) {
  const int half = head_dim / 2;
  const int pair_step = interleave ? 2 : 1, partner = interleave ? 1 : half;
  float lo[kHeadMaxPairs], hi[kHeadMaxPairs];
  float squares = 0.0f;
#pragma unroll
  for (int p = 0; p < kHeadMaxPairs; ++p) {
    const int j = lane + p * kWarpSize;
    lo[p] = j < half ? to_float(x[j * pair_step]) : 0.0f;
    hi[p] = j < half ? to_float(x[j * pair_step + partner]) : 0.0f;
    squares = fmaf(lo[p], lo[p], fmaf(hi[p], hi[p], squares));
  }
  if (weight != nullptr) {  // else the RoPE alone
    const float scale = rsqrtf(warp_sum(squares) / static_cast<float>(head_dim) + eps);
#pragma unroll
    for (int p = 0; p < kHeadMaxPairs; ++p) {
      const int j = lane + p * kWarpSize;
      if (j >= half) break;
      lo[p] = lo[p] * scale * to_float(weight[j * pair_step]);
      hi[p] = hi[p] * scale * to_float(weight[j * pair_step + partner]);
    }
  }
#pragma unroll
  for (int p = 0; p < kHeadMaxPairs; ++p) {
    const int j = lane + p * kWarpSize;
    if (j >= half) break;
    y[j] = from_float<T>(lo[p] * cos[j] - hi[p] * sin[j]);
    y[j + half] = from_float<T>(hi[p] * cos[j] + lo[p] * sin[j]);
  }
}

}  // namespace ddtree::cuda
