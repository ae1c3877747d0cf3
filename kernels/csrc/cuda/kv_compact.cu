// KV-cache compaction kernel (design: kv_compact.cuh).
#include "common.cuh"
#include "kv_compact.cuh"

namespace ddtree::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kBatch = 8;  // path entries whose source rows are loaded before any is stored

template <typename Unit>
__global__ void __launch_bounds__(kThreads) kv_compact_kernel(KvCompactArgs a) {
  const int ckv_units = a.ckv_row_bytes / static_cast<int>(sizeof(Unit));
  const int kpe_units = a.kpe_row_bytes / static_cast<int>(sizeof(Unit));
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= ckv_units + kpe_units) return;
  const bool in_ckv = col < ckv_units;
  const int row_units = in_ckv ? ckv_units : kpe_units;
  Unit* layer = static_cast<Unit*>(in_ckv ? a.ckv : a.kpe) +
                static_cast<size_t>(blockIdx.y) * a.cache_rows * row_units + (in_ckv ? col : col - ckv_units);
  const int64_t prefix = *a.prefix_len;

  bool ended = false;  // a -1 was seen: the entries after it are ignored
  for (int base = 0; base < a.path_size && !ended; base += kBatch) {
    int64_t dst[kBatch];
    int64_t src[kBatch];
    Unit value[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int i = base + k;
      const int64_t node = (!ended && i < a.path_size) ? a.path[i] : -1;
      ended = ended || node < 0;
      dst[k] = prefix + i;
      src[k] = prefix + node;
      const bool in_cache = src[k] >= 0 && src[k] < a.cache_rows && dst[k] >= 0 && dst[k] < a.cache_rows;
      if (ended || !in_cache || src[k] == dst[k]) src[k] = -1;  // -1: nothing to copy
      if (src[k] >= 0) value[k] = layer[src[k] * row_units];
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      if (src[k] >= 0) layer[dst[k] * row_units] = value[k];
    }
  }
}

// The widest unit (16, 8, 4, 2 or 1 bytes) that divides both row widths and both base addresses.
int unit_bytes(const KvCompactArgs& a) {
  const uintptr_t bits = static_cast<uintptr_t>(a.ckv_row_bytes) | static_cast<uintptr_t>(a.kpe_row_bytes) |
                         reinterpret_cast<uintptr_t>(a.ckv) | reinterpret_cast<uintptr_t>(a.kpe);
  int unit = 16;
  while (unit > 1 && (bits & (unit - 1)) != 0) unit /= 2;
  return unit;
}

template <typename Unit>
cudaError_t launch(const KvCompactArgs& a, cudaStream_t stream) {
  const int num_units = (a.ckv_row_bytes + a.kpe_row_bytes) / static_cast<int>(sizeof(Unit));
  const dim3 grid(ceil_div(num_units, kThreads), a.num_layers);
  kv_compact_kernel<Unit><<<grid, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

cudaError_t KvCompact(const KvCompactArgs& args, cudaStream_t stream) {
  if (args.num_layers < 0 || args.num_layers > 65535 || args.ckv_row_bytes < 0 || args.kpe_row_bytes < 0 ||
      args.path_size < 0) {
    return cudaErrorInvalidValue;
  }
  if (args.num_layers == 0 || args.path_size == 0 || args.ckv_row_bytes + args.kpe_row_bytes == 0) return cudaSuccess;
  switch (unit_bytes(args)) {
    case 16: return launch<uint4>(args, stream);
    case 8: return launch<uint2>(args, stream);
    case 4: return launch<uint32_t>(args, stream);
    case 2: return launch<uint16_t>(args, stream);
    default: return launch<uint8_t>(args, stream);
  }
}

}  // namespace ddtree::cuda
