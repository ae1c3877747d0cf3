// A step's commit on the CPU: the accepted path's target tokens appended, the counters moved (contract: kernels/ops.py).
#include "../checks.h"
#include "cpu_ops.h"

namespace ddtree::cpu {

void commit_path(const at::Tensor& target, const at::Tensor& path, const at::Tensor& path_len, const at::Tensor& bonus,
                 const at::Tensor& generated, const at::Tensor& num_generated, const at::Tensor& root,
                 const at::Tensor& prefix_len) {
  check_commit_path_args(target, path, path_len, bonus, generated, num_generated, root, prefix_len);
  const int64_t num_nodes = target.size(0);
  const int64_t path_size = path.size(0);
  const int64_t len = *path_len.const_data_ptr<int64_t>();
  const int64_t start = *num_generated.const_data_ptr<int64_t>();
  TORCH_CHECK(len >= 1 && len <= path_size, "path_len must be in [1, P = path.size(0) = ", path_size, "], got ", len);
  TORCH_CHECK(start >= 0, "num_generated must be >= 0, got ", start);
  const int64_t* nodes = path.const_data_ptr<int64_t>();
  const int64_t path_stride = path.stride(0);
  for (int64_t i = 0; i < len; ++i) {  // every value checked before anything is written
    const int64_t node = nodes[i * path_stride];
    TORCH_CHECK(node >= 0 && node < num_nodes, "path[", i, "] = ", node, " is not a node index in [0, N = ",
                num_nodes, ") (the first path_len = ", len, " entries must be the accepted nodes)");
  }

  const int64_t* tokens = target.const_data_ptr<int64_t>();
  const int64_t target_stride = target.stride(0);
  int64_t* out = generated.mutable_data_ptr<int64_t>();
  const int64_t num_slots = generated.size(0);
  for (int64_t i = 0; i < len && start + i < num_slots; ++i) {  // slots past G are dropped
    out[start + i] = tokens[nodes[i * path_stride] * target_stride];
  }
  *num_generated.mutable_data_ptr<int64_t>() = start + len;
  *prefix_len.mutable_data_ptr<int64_t>() += len;
  *root.mutable_data_ptr<int64_t>() = *bonus.const_data_ptr<int64_t>();
}

}  // namespace ddtree::cpu
