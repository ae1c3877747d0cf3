// The latent cache write on the CPU (contract: kernels/ops.py): each row's RMSNorm into ckv and RoPE into kpe at its
// cache row, through rms_norm_rows' and head_norm_rope's own per-row code (row_norm.h), rows spread over threads.
#include <ATen/Parallel.h>

#include "../checks.h"
#include "cpu_ops.h"
#include "row_norm.h"

namespace ddtree::cpu {
namespace {

template <typename T, typename W>
void write_rows(const at::Tensor& kv, const at::Tensor& weight, const at::Tensor& cos, const at::Tensor& sin,
                float eps, bool interleave, const at::Tensor& ckv, const at::Tensor& kpe, const at::Tensor& rows) {
  const int64_t lat_dim = ckv.size(1), rope_dim = kpe.size(1), half = rope_dim / 2;
  const int64_t kv_stride = kv.stride(0), rows_stride = rows.stride(0);
  const T* src = kv.const_data_ptr<T>();
  const W* w = weight.const_data_ptr<W>();
  const float* c = cos.const_data_ptr<float>();
  const float* s = sin.const_data_ptr<float>();
  const int64_t* cache_rows = rows.const_data_ptr<int64_t>();
  T* lat = ckv.mutable_data_ptr<T>();
  T* rope = kpe.mutable_data_ptr<T>();
  at::parallel_for(0, kv.size(0), 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T* row = src + i * kv_stride;
      const int64_t dst = cache_rows[i * rows_stride];
      rms_norm_row(row, w, lat_dim, eps, lat + dst * lat_dim);
      // head_norm_rope's RoPE alone: no weight (float, as that op passes it) and no eps
      norm_rope_head<T, float>(row + lat_dim, nullptr, c + i * half, s + i * half, rope_dim, 0.0f, interleave,
                               rope + dst * rope_dim);
    }
  });
}

}  // namespace

void latent_write(const at::Tensor& kv, const at::Tensor& weight, const at::Tensor& cos, const at::Tensor& sin,
                  double eps, bool interleave, const at::Tensor& ckv, const at::Tensor& kpe, const at::Tensor& rows) {
  check_latent_write_args(kv, weight, cos, sin, eps, ckv, kpe, rows);
  const int64_t num_rows = kv.size(0), cache_rows = ckv.size(0);
  const int64_t* dst = rows.const_data_ptr<int64_t>();
  for (int64_t i = 0; i < num_rows; ++i) {  // every value checked before anything is written
    const int64_t row = dst[i * rows.stride(0)];
    TORCH_CHECK(row >= 0 && row < cache_rows, "rows[", i, "] = ", row, " is not a cache row in [0, S = ", cache_rows,
                ") (ckv.size(0))");
  }
  const auto e = static_cast<float>(eps);
  if (kv.scalar_type() == at::kFloat) {
    write_rows<float, float>(kv, weight, cos, sin, e, interleave, ckv, kpe, rows);
  } else if (weight.scalar_type() == at::kFloat) {
    write_rows<c10::BFloat16, float>(kv, weight, cos, sin, e, interleave, ckv, kpe, rows);
  } else {
    write_rows<c10::BFloat16, c10::BFloat16>(kv, weight, cos, sin, e, interleave, ckv, kpe, rows);
  }
}

}  // namespace ddtree::cpu
