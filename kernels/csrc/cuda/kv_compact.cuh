// Moves the accepted path's cache rows next to the prefix, in every layer, in one launch (contract:
// kernels/ops.py). prefix_len and path are read on the device.
//
// Grid (column tile, layer); a thread owns fixed 16-byte (or narrower) columns of the ckv and kpe rows
// and copies them for every path entry. For an increasing path, destination row prefix_len + i never
// lies above a source row prefix_len + path[j] with j >= i, and sources of later entries lie above every
// earlier destination, so loading a batch of source rows before storing them is the forward copy.
// Where the CPU op raises (a path entry that is negative before the first -1, not increasing, or points
// past S), this one cannot without a host sync: entries whose rows fall outside the cache are skipped.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ddtree::cuda {

struct KvCompactArgs {
  void* ckv;                  // [num_layers, S, ckv_row_bytes]
  void* kpe;                  // [num_layers, S, kpe_row_bytes]
  int num_layers;
  int cache_rows;             // S
  int ckv_row_bytes;
  int kpe_row_bytes;
  const int64_t* prefix_len;  // 0-dim, on the device
  const int64_t* path;        // [path_size], padded with -1
  int path_size;
};

cudaError_t KvCompact(const KvCompactArgs& args, cudaStream_t stream);

}  // namespace ddtree::cuda
