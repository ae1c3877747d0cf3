// verify_attn's batch-invariant kernel on the CPU (contract: kernels/ops.py, batch_invariant=True).
//
// A node's visible rows are, in order, the prefix rows 0 .. prefix_len - 1 and then its block rows in index
// order; for a tree node those are its ancestors, whose positions run prefix_len, prefix_len + 1, ...: the
// same sequence of keys, in the same order, that AR sees at that node's position. Each (node, head) is reduced
// over that sequence alone, one key after another (scores, their maximum, then the exp-sum and the weighted
// sum), so its result depends only on the sequence: not on how many nodes the call holds, where its rows sit
// in the cache, or how the work is split over threads.
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "../checks.h"
#include "cpu_ops.h"

namespace ddtree::cpu {
namespace {

// A dot product in one fixed order: eight float32 lanes, summed pairwise at the end.
template <typename T>
float exact_dot(const float* q, const T* k, int64_t n) {
  float lane[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) lane[j] += q[i + j] * static_cast<float>(k[i + j]);
  }
  float sum = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  for (; i < n; ++i) sum += q[i] * static_cast<float>(k[i]);
  return sum;
}

struct ExactDims {
  int64_t num_nodes, num_heads, lat_dim, rope_dim, prefix_len;
  float scale;
};

template <typename T>
void attend_in_order(const T* q_lat, const T* q_pe, const T* ckv, const T* kpe, const bool* mask_row,
                     const ExactDims& d, std::vector<float>& q, std::vector<float>& scores, std::vector<int64_t>& rows,
                     std::vector<float>& acc, T* o_lat, float* lse) {
  for (int64_t r = 0; r < d.lat_dim; ++r) q[r] = static_cast<float>(q_lat[r]);
  for (int64_t r = 0; r < d.rope_dim; ++r) q[d.lat_dim + r] = static_cast<float>(q_pe[r]);
  int64_t num = 0;
  float max_score = -std::numeric_limits<float>::infinity();
  for (int64_t u = 0; u < d.prefix_len + d.num_nodes; ++u) {
    if (u >= d.prefix_len && !mask_row[u - d.prefix_len]) continue;
    const float s = d.scale * (exact_dot(q.data(), ckv + u * d.lat_dim, d.lat_dim) +
                               exact_dot(q.data() + d.lat_dim, kpe + u * d.rope_dim, d.rope_dim));
    rows[num] = u;
    scores[num++] = s;
    max_score = std::max(max_score, s);
  }
  if (num == 0) {
    std::fill(o_lat, o_lat + d.lat_dim, static_cast<T>(0.0f));
    *lse = -std::numeric_limits<float>::infinity();
    return;
  }
  std::fill(acc.begin(), acc.end(), 0.0f);
  float sum = 0.0f;
  for (int64_t v = 0; v < num; ++v) {
    const float p = std::exp(scores[v] - max_score);
    sum += p;
    const T* row = ckv + rows[v] * d.lat_dim;
    for (int64_t r = 0; r < d.lat_dim; ++r) acc[r] += p * static_cast<float>(row[r]);
  }
  const float inv = 1.0f / sum;
  for (int64_t r = 0; r < d.lat_dim; ++r) o_lat[r] = static_cast<T>(acc[r] * inv);
  *lse = max_score + std::log(sum);
}

template <typename T>
void run_exact(const at::Tensor& q_lat, const at::Tensor& q_pe, const at::Tensor& ckv, const at::Tensor& kpe,
               const at::Tensor& block_mask, const ExactDims& d, at::Tensor& o_lat, at::Tensor& lse) {
  const T* q_lat_p = q_lat.const_data_ptr<T>();
  const T* q_pe_p = q_pe.const_data_ptr<T>();
  const T* ckv_p = ckv.const_data_ptr<T>();
  const T* kpe_p = kpe.const_data_ptr<T>();
  const bool* mask_p = block_mask.const_data_ptr<bool>();
  T* o_p = o_lat.mutable_data_ptr<T>();
  float* lse_p = lse.mutable_data_ptr<float>();
  const int64_t max_rows = d.prefix_len + d.num_nodes;
  at::parallel_for(0, d.num_nodes * d.num_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> q(d.lat_dim + d.rope_dim), scores(max_rows), acc(d.lat_dim);
    std::vector<int64_t> rows(max_rows);
    for (int64_t nh = begin; nh < end; ++nh) {
      attend_in_order<T>(q_lat_p + nh * d.lat_dim, q_pe_p + nh * d.rope_dim, ckv_p, kpe_p,
                         mask_p + (nh / d.num_heads) * d.num_nodes, d, q, scores, rows, acc, o_p + nh * d.lat_dim,
                         lse_p + nh);
    }
  });
}

}  // namespace

void verify_attn_exact(const at::Tensor& q_lat, const at::Tensor& q_pe, const at::Tensor& ckv, const at::Tensor& kpe,
                       const at::Tensor& block_mask, int64_t prefix, double scale, at::Tensor& o_lat, at::Tensor& lse) {
  const ExactDims d{q_lat.size(0), q_lat.size(1), q_lat.size(2), q_pe.size(2), prefix, static_cast<float>(scale)};
  if (q_lat.scalar_type() == at::kFloat) {
    run_exact<float>(q_lat, q_pe, ckv, kpe, block_mask, d, o_lat, lse);
  } else {
    run_exact<c10::BFloat16>(q_lat, q_pe, ckv, kpe, block_mask, d, o_lat, lse);
  }
}

}  // namespace ddtree::cpu
