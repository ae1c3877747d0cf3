// cache_attn through torch's own attention (contract: kernels/ops.py): the CPU implementation, and the CUDA one
// where the tensor-core kernel does not apply (float32, another head dim, an older GPU). The query heads of a
// key/value head attend as G * N rows of one head (no repeated keys), and the valid rows are a mask built on the
// device from num_visible, so a captured CUDA graph serves every cache length.
#pragma once

#include <ATen/ATen.h>

namespace ddtree {

// num_visible must already be in [1, S] (the CPU op checks it; CUDA clamps it first).
inline at::Tensor cache_attn_torch(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                                   const at::Tensor& num_visible, double scale) {
  const int64_t num_nodes = q.size(0), num_heads = q.size(1), dim = q.size(2);
  const int64_t cache_rows = keys.size(0), num_kv = keys.size(1), groups = num_heads / num_kv;
  const at::Tensor rows = q.view({num_nodes, num_kv, groups, dim}).permute({1, 2, 0, 3}).reshape(
      {1, num_kv, groups * num_nodes, dim});
  const at::Tensor visible = at::arange(cache_rows, num_visible.options()).lt(num_visible).view({1, 1, 1, cache_rows});
  const at::Tensor out = at::scaled_dot_product_attention(rows, keys.transpose(0, 1).unsqueeze(0),
                                                          values.transpose(0, 1).unsqueeze(0), visible, 0.0, false,
                                                          scale);  // [1, Hkv, G * N, D]
  return out.view({num_kv, groups, num_nodes, dim}).permute({2, 0, 1, 3}).reshape({num_nodes, num_heads, dim})
      .contiguous();
}

}  // namespace ddtree
