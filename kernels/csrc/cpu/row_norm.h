// The per-row math of rms_norm_rows and head_norm_rope on the CPU, shared with latent_write so that its rows are
// those ops' bits: a row's RMSNorm (its sum of squares one float32 chain in column order) and a head's norm and RoPE.
#pragma once

#include <cmath>
#include <cstdint>

namespace ddtree::cpu {

// out = row * rsqrt(mean(row^2) + eps) * weight over width values, in float32, rounded to T once.
template <typename T, typename W>
inline void rms_norm_row(const T* row, const W* weight, int64_t width, float eps, T* out) {
  float squares = 0.0f;
  for (int64_t d = 0; d < width; ++d) {
    const float v = static_cast<float>(row[d]);
    squares += v * v;
  }
  const float scale = 1.0f / std::sqrt(squares / static_cast<float>(width) + eps);
  for (int64_t d = 0; d < width; ++d) {
    out[d] = static_cast<T>(static_cast<float>(row[d]) * scale * static_cast<float>(weight[d]));
  }
}

// One head of dim values: its RMSNorm by weight [dim] (nullptr: none, and eps unused), then the rotate-half RoPE at
// the angles cos, sin [dim / 2], into out [dim]. Pair j is (j, j + dim/2), or (2j, 2j + 1) with interleave; its turned
// values go to out[j] and out[j + dim/2].
template <typename T, typename W>
inline void norm_rope_head(const T* head, const W* weight, const float* cos, const float* sin, int64_t dim, float eps,
                           bool interleave, T* out) {
  const int64_t half = dim / 2;
  const int64_t pair_step = interleave ? 2 : 1, partner = interleave ? 1 : half;
  float scale = 1.0f;
  if (weight != nullptr) {
    float squares = 0.0f;
    for (int64_t d = 0; d < dim; ++d) {
      const float v = static_cast<float>(head[d]);
      squares += v * v;
    }
    scale = 1.0f / std::sqrt(squares / static_cast<float>(dim) + eps);
  }
  for (int64_t j = 0; j < half; ++j) {
    const int64_t first = j * pair_step, second = first + partner;
    float u = static_cast<float>(head[first]), v = static_cast<float>(head[second]);
    if (weight != nullptr) {
      u = u * scale * static_cast<float>(weight[first]);
      v = v * scale * static_cast<float>(weight[second]);
    }
    out[j] = static_cast<T>(u * cos[j] - v * sin[j]);
    out[j + half] = static_cast<T>(v * cos[j] + u * sin[j]);
  }
}

}  // namespace ddtree::cpu
