// Absorbed-MLA attention of a block of nodes over the latent cache, on the CPU (contract: kernels/ops.py).
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

// Dot product accumulated in float32 over eight independent lanes, so the compiler can vectorise it
// without reassociating (no fast-math); the lanes are summed in a fixed order.
template <typename T>
float dot(const float* q, const T* k, int64_t n) {
  float lane[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) lane[j] += q[i + j] * static_cast<float>(k[i + j]);
  }
  float sum = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  for (; i < n; ++i) sum += q[i] * static_cast<float>(k[i]);
  return sum;
}

struct Dims {
  int64_t num_nodes, num_heads, lat_dim, rope_dim, prefix_len;
  float scale;
};

// One (node, head) pair: two-pass softmax over the visible rows (scores, then max, then weighted sum).
template <typename T>
void attend_one(const T* q_lat, const T* q_pe, const T* ckv, const T* kpe, const bool* mask_row, const Dims& d,
                std::vector<float>& q_buf, std::vector<float>& scores, std::vector<int64_t>& rows,
                std::vector<float>& acc, T* o_lat, float* lse) {
  std::transform(q_lat, q_lat + d.lat_dim, q_buf.begin(), [](T x) { return static_cast<float>(x); });
  std::transform(q_pe, q_pe + d.rope_dim, q_buf.begin() + d.lat_dim, [](T x) { return static_cast<float>(x); });
  const float* q_lat_f = q_buf.data();
  const float* q_pe_f = q_buf.data() + d.lat_dim;

  int64_t num_visible = 0;
  float max_score = -std::numeric_limits<float>::infinity();
  for (int64_t u = 0; u < d.prefix_len + d.num_nodes; ++u) {
    if (u >= d.prefix_len && !mask_row[u - d.prefix_len]) continue;
    const float s =
        d.scale * (dot(q_lat_f, ckv + u * d.lat_dim, d.lat_dim) + dot(q_pe_f, kpe + u * d.rope_dim, d.rope_dim));
    rows[num_visible] = u;
    scores[num_visible] = s;
    max_score = std::max(max_score, s);
    ++num_visible;
  }
  if (num_visible == 0) {  // nothing to attend to: a zero output and an empty log-sum-exp
    std::fill(o_lat, o_lat + d.lat_dim, static_cast<T>(0.0f));
    *lse = -std::numeric_limits<float>::infinity();
    return;
  }

  std::fill(acc.begin(), acc.end(), 0.0f);
  float sum = 0.0f;
  for (int64_t v = 0; v < num_visible; ++v) {
    const float p = std::exp(scores[v] - max_score);
    sum += p;
    const T* row = ckv + rows[v] * d.lat_dim;
    for (int64_t r = 0; r < d.lat_dim; ++r) acc[r] += p * static_cast<float>(row[r]);
  }
  const float inv_sum = 1.0f / sum;
  for (int64_t r = 0; r < d.lat_dim; ++r) o_lat[r] = static_cast<T>(acc[r] * inv_sum);
  *lse = max_score + std::log(sum);
}

template <typename T>
void verify_attn_kernel(const at::Tensor& q_lat, const at::Tensor& q_pe, const at::Tensor& ckv, const at::Tensor& kpe,
                        const at::Tensor& block_mask, const Dims& d, at::Tensor& o_lat, at::Tensor& lse) {
  const T* q_lat_p = q_lat.const_data_ptr<T>();  // [N, H, R]
  const T* q_pe_p = q_pe.const_data_ptr<T>();    // [N, H, P]
  const T* ckv_p = ckv.const_data_ptr<T>();      // [S, R]
  const T* kpe_p = kpe.const_data_ptr<T>();      // [S, P]
  const bool* mask_p = block_mask.const_data_ptr<bool>();  // [N, N]
  T* o_p = o_lat.mutable_data_ptr<T>();                    // [N, H, R]
  float* lse_p = lse.mutable_data_ptr<float>();            // [N, H]
  const int64_t num_visible_max = d.prefix_len + d.num_nodes;
  at::parallel_for(0, d.num_nodes * d.num_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> q_buf(d.lat_dim + d.rope_dim), scores(num_visible_max), acc(d.lat_dim);
    std::vector<int64_t> rows(num_visible_max);
    for (int64_t nh = begin; nh < end; ++nh) {
      const int64_t node = nh / d.num_heads;
      attend_one<T>(q_lat_p + nh * d.lat_dim, q_pe_p + nh * d.rope_dim, ckv_p, kpe_p, mask_p + node * d.num_nodes, d,
                    q_buf, scores, rows, acc, o_p + nh * d.lat_dim, lse_p + nh);
    }
  });
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> verify_attn(const at::Tensor& q_lat, const at::Tensor& q_pe, const at::Tensor& ckv,
                                               const at::Tensor& kpe, const at::Tensor& prefix_len,
                                               const at::Tensor& block_mask, double scale) {
  check_verify_attn_args(q_lat, q_pe, ckv, kpe, prefix_len, block_mask);
  const int64_t num_nodes = q_lat.size(0);
  const int64_t cache_rows = ckv.size(0);
  const int64_t prefix = *prefix_len.const_data_ptr<int64_t>();
  TORCH_CHECK(prefix >= 0, "prefix_len must be >= 0, got ", prefix);
  TORCH_CHECK(prefix + num_nodes <= cache_rows, "prefix_len + N must be <= S (the block's rows follow the prefix in ",
              "the cache), got prefix_len = ", prefix, ", N = ", num_nodes, ", S = ", cache_rows);
  const Dims d{num_nodes, q_lat.size(1), q_lat.size(2), q_pe.size(2), prefix, static_cast<float>(scale)};

  at::Tensor o_lat = at::empty_like(q_lat);
  at::Tensor lse = at::empty({num_nodes, d.num_heads}, q_lat.options().dtype(at::kFloat));
  if (q_lat.scalar_type() == at::kFloat) {
    verify_attn_kernel<float>(q_lat, q_pe, ckv, kpe, block_mask, d, o_lat, lse);
  } else {
    verify_attn_kernel<c10::BFloat16>(q_lat, q_pe, ckv, kpe, block_mask, d, o_lat, lse);
  }
  return {o_lat, lse};
}

}  // namespace ddtree::cpu
