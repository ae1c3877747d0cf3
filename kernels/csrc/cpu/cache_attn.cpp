// cache_attn on the CPU (contract: kernels/ops.py): torch's attention over the valid rows (cache_attn_torch.h),
// after the value check the CUDA op cannot make without a host sync.
#include "../cache_attn_torch.h"
#include "../checks.h"
#include "cpu_ops.h"

namespace ddtree::cpu {

at::Tensor cache_attn(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                      const at::Tensor& num_visible, double scale) {
  check_cache_attn_args(q, keys, values, num_visible, scale);
  const int64_t visible = num_visible.item<int64_t>();
  TORCH_CHECK(visible >= 1 && visible <= keys.size(0), "num_visible must be in [1, S = ", keys.size(0),
              "] (the valid cache rows), got ", visible);
  return cache_attn_torch(q, keys, values, num_visible, scale);
}

}  // namespace ddtree::cpu
