// Moves the accepted path's cache rows next to the prefix, on the CPU (contract: kernels/ops.py).
#include <cstring>

#include "../checks.h"
#include "cpu_ops.h"

namespace ddtree::cpu {
namespace {

// Number of path entries before the first -1, after checking the entries are increasing node indices
// whose rows lie inside the cache (so the forward in-place copy never reads a row it already wrote).
int64_t accepted_length(const int64_t* path, int64_t path_size, int64_t prefix, int64_t cache_rows) {
  int64_t n = 0;
  for (; n < path_size && path[n] != -1; ++n) {
    TORCH_CHECK(path[n] >= 0, "path[", n, "] = ", path[n], " is neither a node index nor the -1 padding");
    TORCH_CHECK(n == 0 || path[n] > path[n - 1], "path must be increasing (children after parents), got path[", n - 1,
                "] = ", path[n - 1], " and path[", n, "] = ", path[n]);
    TORCH_CHECK(prefix + path[n] < cache_rows, "path[", n, "] = ", path[n], " points at cache row prefix_len + ",
                path[n], " = ", prefix + path[n], ", beyond S = ", cache_rows);
  }
  return n;
}

void copy_rows(const at::Tensor& cache, int64_t prefix, const int64_t* path, int64_t path_len) {
  const int64_t num_layers = cache.size(0);
  const int64_t cache_rows = cache.size(1);
  const int64_t row_bytes = cache.size(2) * static_cast<int64_t>(cache.element_size());
  char* base = static_cast<char*>(cache.mutable_data_ptr());  // [num_layers, S, width]
  for (int64_t layer = 0; layer < num_layers; ++layer) {
    char* rows = base + layer * cache_rows * row_bytes;
    for (int64_t i = 0; i < path_len; ++i) {
      if (path[i] == i) continue;
      std::memcpy(rows + (prefix + i) * row_bytes, rows + (prefix + path[i]) * row_bytes, row_bytes);
    }
  }
}

}  // namespace

void kv_compact(const at::Tensor& ckv, const at::Tensor& kpe, const at::Tensor& prefix_len, const at::Tensor& path) {
  check_kv_compact_args(ckv, kpe, prefix_len, path);
  const int64_t prefix = *prefix_len.const_data_ptr<int64_t>();
  TORCH_CHECK(prefix >= 0, "prefix_len must be >= 0, got ", prefix);
  const int64_t* path_p = path.const_data_ptr<int64_t>();
  const int64_t path_len = accepted_length(path_p, path.size(0), prefix, ckv.size(1));
  copy_rows(ckv, prefix, path_p, path_len);
  copy_rows(kpe, prefix, path_p, path_len);
}

}  // namespace ddtree::cpu
