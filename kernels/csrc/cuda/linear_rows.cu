// The row-invariant matmul's kernels (linear_rows.cuh has the contract and why each is row-invariant).
//
// bfloat16: a block owns 64 or 128 output columns, one K range (split) and a tile of rows of one group (grouped: the
// grid's x walks the tiles group by group, grouped_tile). K streams through shared memory in chunks of 64 (4 stages
// of cp.async, 6 in a wgmma block of 8 rows; 16-byte pieces swizzled by row, the 128-byte swizzle that wgmma reads
// and that spares ldmatrix bank conflicts). The row tile is the grid's fastest index, so the blocks that read the same
// weight slab for different rows run side by side and share it through L2.
// - sm_90a: one or two warpgroups a block, each with its 64 columns of the weight tile as wgmma's M and the block's
//   rows as its N (m64nNk16 per 16 of K, N = 8 .. 256 by the rows: each row a column of the instruction).
// - sm_80 and later elsewhere: four warps of 16 columns each, mma.sync m16n8k16 per 16-row tile (16 * MT rows).
#include <algorithm>

#include "common.cuh"
#include "linear_rows.cuh"
#include "verify_attn_mma.cuh"
#include "verify_attn_wgmma.cuh"
#include "wgmma.cuh"

namespace ddtree::cuda {
namespace {

constexpr int kBlockCols = 64;                 // output columns per mma.sync block (4 warps x 16)
constexpr int kWgCols = 64;                    // per warpgroup of a wgmma block
constexpr int kChunk = 64;                     // K elements per shared-memory stage
constexpr int kStages = 4;
constexpr int kThreads = 128;
constexpr int kLineBytes = kChunk * 2;         // one row's chunk: 8 pieces of 16 bytes
constexpr int kMinBlocksPerSm = 2;             // the plan splits K until the grid has this many blocks per SM
constexpr int kMinSplitDepth = 4 * kChunk;     // and no split is shorter than this
constexpr int kWarpRows = 8;                   // float32: rows per warp (its weight loads serve all of them)

__device__ __forceinline__ void cp_async_wait_stages() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 2) : "memory");
}

// Byte offset of 16-byte piece `piece` of row `row` in a stage's tile.
__device__ __forceinline__ int swizzled(int row, int piece) { return row * kLineBytes + ((piece ^ (row & 7)) << 4); }

// The rows [begin, end) of group g.
__device__ __forceinline__ void group_rows(const LinearRowsArgs& a, int g, int& begin, int& end) {
  begin = 0;
  end = a.num_rows;
  if (a.group_ends != nullptr) {
    begin = g > 0 ? min(max(a.group_ends[g - 1], 0), a.num_rows) : 0;
    end = min(max(a.group_ends[g], begin), a.num_rows);
  }
}

// A grouped call's row tiles, numbered group by group (group g's rows in tiles of tile_rows, a group of no rows
// taking none): at most min(M, ceil(M / tile_rows) + G) of them, the grid's x (grouped_tiles), so a launch holds no
// block per group and row chunk that no routing can fill (at 384 experts and 257 tokens that was 31 million blocks).
__host__ __device__ __forceinline__ int grouped_tiles(int num_rows, int num_groups, int tile_rows) {
  return min(num_rows, ceil_div(num_rows, tile_rows) + num_groups);
}

// Tile `tile` of a grouped call: its group g and rows [begin, end); false past the last tile. Every thread of the
// block calls it: each counts the tiles of its share of the groups, an exclusive scan over the block places them,
// and the thread whose share holds the tile names it (a few hundred cycles against the tile's K loop). scratch: 35
// ints of the block's dynamic shared memory, free again when it returns (static shared memory would count against
// the 48 KB a kernel may take without asking).
__device__ bool grouped_tile(const LinearRowsArgs& a, int tile_rows, int tile, int* scratch, int& g, int& begin,
                             int& end) {
  int* warp_tiles = scratch;  // [32]
  int* found = scratch + 32;  // [3]
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int per_thread = ceil_div(a.num_groups, blockDim.x);
  const int lo = min(static_cast<int>(threadIdx.x) * per_thread, a.num_groups);
  const int hi = min(lo + per_thread, a.num_groups);
  int count = 0;
  for (int i = lo; i < hi; ++i) {
    int b, e;
    group_rows(a, i, b, e);
    count += ceil_div(e - b, tile_rows);
  }
  int before = count;  // the inclusive scan within the warp, then the warps before this one
  for (int offset = 1; offset < kWarpSize; offset <<= 1) {
    const int other = __shfl_up_sync(kFullMask, before, offset);
    if (lane >= offset) before += other;
  }
  if (lane == kWarpSize - 1) warp_tiles[warp] = before;
  if (threadIdx.x == 0) found[0] = -1;
  __syncthreads();
  before -= count;
  for (int w = 0; w < warp; ++w) before += warp_tiles[w];
  if (tile >= before && tile < before + count) {
    int rest = tile - before;
    for (int i = lo; i < hi; ++i) {
      int b, e;
      group_rows(a, i, b, e);
      const int n = ceil_div(e - b, tile_rows);
      if (rest < n) {
        found[0] = i, found[1] = b + rest * tile_rows, found[2] = e;
        break;
      }
      rest -= n;
    }
  }
  __syncthreads();
  g = found[0], begin = found[1], end = found[2];
  __syncthreads();  // every thread has read it before the first stage load overwrites it
  return g >= 0;
}

// What a bfloat16 block computes: its columns from n0 of group g for rows r0 .. r0 + num_rows - 1, over K range
// [k_begin, k_end) (split `split`).
struct BlockTile {
  const __nv_bfloat16* w;  // group g's weight
  const __nv_bfloat16* x;  // group g's rows
  int g, split, n0, r0, num_rows, k_begin, k_end, num_chunks;
};

// The block's tile for tiles of tile_rows rows and cols columns (grouped: tile blockIdx.x of grouped_tile, with
// the block's shared memory as its scratch; else group blockIdx.z's row chunk blockIdx.x); false when it has no rows.
// Every thread of the block calls it.
__device__ __forceinline__ bool block_tile(const LinearRowsArgs& a, int num_col_tiles, int tile_rows, int cols,
                                           uint8_t* smem, BlockTile& t) {
  t.split = blockIdx.y / num_col_tiles;
  t.n0 = blockIdx.y % num_col_tiles * cols;
  int row_end = a.num_rows;
  if (a.group_ends != nullptr) {
    if (!grouped_tile(a, tile_rows, blockIdx.x, reinterpret_cast<int*>(smem), t.g, t.r0, row_end)) return false;
  } else {
    t.g = blockIdx.z;
    t.r0 = blockIdx.x * tile_rows;
    if (t.r0 >= row_end) return false;
  }
  t.num_rows = min(tile_rows, row_end - t.r0);
  t.k_begin = t.split * a.plan.split_depth;
  t.k_end = min(a.depth, t.k_begin + a.plan.split_depth);
  t.num_chunks = ceil_div(t.k_end - t.k_begin, kChunk);
  t.w = static_cast<const __nv_bfloat16*>(a.weight) + static_cast<int64_t>(t.g) * a.num_cols * a.depth;
  t.x = static_cast<const __nv_bfloat16*>(a.x) + static_cast<int64_t>(t.g) * a.group_stride;
  return true;
}

// K chunk `chunk` of the block's kCols weight rows then its kTileRows x rows into a stage, one line each, as
// cp.async 16-byte pieces spread over kBlockThreads threads; out-of-range pieces are zeros.
template <int kCols, int kTileRows, int kBlockThreads>
__device__ __forceinline__ void load_stage(uint8_t* stage, const LinearRowsArgs& a, const BlockTile& t, int chunk) {
  const int k0 = t.k_begin + chunk * kChunk;
  for (int i = threadIdx.x; i < (kCols + kTileRows) * 8; i += kBlockThreads) {
    const int line = i / 8, piece = i % 8, k = k0 + piece * 8;
    const bool weight_line = line < kCols;
    const int n = t.n0 + line, m = line - kCols;
    const bool valid = k < t.k_end && (weight_line ? n < a.num_cols : m < t.num_rows);
    const __nv_bfloat16* src = weight_line ? t.w + static_cast<int64_t>(n) * a.depth + k
                                           : t.x + (t.r0 + m) * a.row_stride + k;
    cp_async_16(stage + swizzled(line, piece), valid ? src : t.w, valid);
  }
}

// The epilogue's store of output (row, n) of the block: bfloat16 into out, or fp32 into its split's partial sums.
__device__ __forceinline__ void store_output(const LinearRowsArgs& a, const BlockTile& t, int row, int n, float value) {
  if (row >= t.num_rows || n >= a.num_cols) return;
  const int64_t at = (static_cast<int64_t>(t.r0 + row) * a.out_groups + (a.group_ends != nullptr ? 0 : t.g)) *
                         a.num_cols + n;
  if (a.plan.num_splits == 1) {
    static_cast<__nv_bfloat16*>(a.out)[at] = __float2bfloat16_rn(value);
  } else {
    a.partial[t.split * (static_cast<int64_t>(a.num_rows) * a.out_groups * a.num_cols) + at] = value;
  }
}

template <int MT>
__global__ void __launch_bounds__(kThreads) linear_rows_mma(const LinearRowsArgs a, int num_col_tiles) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  constexpr int kTileRows = 16 * MT;
  constexpr int kStageBytes = (kBlockCols + kTileRows) * kLineBytes;
  extern __shared__ __align__(128) uint8_t smem[];
  BlockTile t;
  if (!block_tile(a, num_col_tiles, kTileRows, kBlockCols, smem, t)) return;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;

  float acc[MT][2][4] = {};
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < t.num_chunks) load_stage<kBlockCols, kTileRows, kThreads>(smem + s * kStageBytes, a, t, s);
    cp_async_commit();
  }
  const int num_tiles = ceil_div(t.num_rows, 16);
  for (int chunk = 0; chunk < t.num_chunks; ++chunk) {
    cp_async_wait_stages();
    __syncthreads();  // the stage is in; every warp is done with the one the next load overwrites
    const int next = chunk + kStages - 1;
    if (next < t.num_chunks) {
      load_stage<kBlockCols, kTileRows, kThreads>(smem + next % kStages * kStageBytes, a, t, next);
    }
    cp_async_commit();
    const uint8_t* ws = smem + (chunk % kStages) * kStageBytes;
    const uint8_t* xs = ws + kBlockCols * kLineBytes;
#pragma unroll
    for (int kk = 0; kk < kChunk / 16; ++kk) {
      uint32_t b[4];  // the warp's 16 columns: b[0], b[1] of columns 0-7, b[2], b[3] of 8-15
      const int quarter = lane >> 3;
      ldmatrix_x4(b, ws + swizzled(warp * 16 + (lane & 7) + 8 * (quarter >> 1), 2 * kk + (quarter & 1)));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if (mt < num_tiles) {
          uint32_t frag[4];
          ldmatrix_x4(frag, xs + swizzled(mt * 16 + (lane & 7) + 8 * (quarter & 1), 2 * kk + (lane >> 4)));
          mma_bf16_16816(acc[mt][0], frag, b[0], b[1]);
          mma_bf16_16816(acc[mt][1], frag, b[2], b[3]);
        }
      }
    }
  }
  cp_async_wait_all();
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      // acc[mt][j][e]: row 16 mt + lane / 4 + 8 (e / 2), column 8 j + 2 (lane % 4) + e % 2
      for (int e = 0; e < 4; ++e) {
        store_output(a, t, mt * 16 + lane / 4 + 8 * (e / 2), t.n0 + warp * 16 + j * 8 + 2 * (lane % 4) + e % 2,
                     acc[mt][j][e]);
      }
    }
  }
#endif
}

// wgmma: kDepth stages, kDepth - 2 chunks loaded ahead, so that a chunk's MMAs run while the next chunk's are issued
// (the slot a load overwrites was read by the MMAs of two chunks before, which the wait at each chunk's end has seen
// out). A block of 8 rows in one warpgroup streams 64 columns' weights and little else (an AR step's experts, a
// batch-invariant decode's projections), and the bytes it keeps in flight bound it: its depth is 6 (4 chunks, 32 KB
// ahead; 4 blocks of 57 KB fit an SM's 228 KB, so Kimi-K2's 8 experts' gate_up, 512 blocks, run in one wave), else 4.
template <int kRows, int kGroups>
constexpr int kWgmmaDepth = kRows == 8 && kGroups == 1 ? 6 : kStages;

template <int kAhead>
__device__ __forceinline__ void cp_async_wait_ahead() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kAhead - 1) : "memory");
}

// kRows rows a block: the wgmma's N; each of its kGroups warpgroups owns 64 of its columns, all reading one rows tile.
template <int kRows, int kGroups>
__global__ void __launch_bounds__(kGroups * kThreads) linear_rows_wgmma(const LinearRowsArgs a, int num_col_tiles) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kCols = kGroups * kWgCols, kBlockThreads = kGroups * kThreads;
  constexpr int kDepth = kWgmmaDepth<kRows, kGroups>, kAhead = kDepth - 2;
  constexpr int kStageBytes = (kCols + kRows) * kLineBytes;
  extern __shared__ uint8_t raw[];
  uint8_t* smem = raw + ((1024 - (smem_addr(raw) & 1023)) & 1023);  // swizzle atoms are 1024-byte aligned
  BlockTile t;
  if (!block_tile(a, num_col_tiles, kRows, kCols, smem, t)) return;
  const int group = threadIdx.x / kThreads;

  float d[kRows / 2];
#pragma unroll
  for (int i = 0; i < kRows / 2; ++i) d[i] = 0.0f;
  for (int s = 0; s < kAhead; ++s) {
    if (s < t.num_chunks) load_stage<kCols, kRows, kBlockThreads>(smem + s * kStageBytes, a, t, s);
    cp_async_commit();
  }
  for (int chunk = 0; chunk < t.num_chunks; ++chunk) {
    cp_async_wait_ahead<kAhead>();
    wg::fence_proxy_async();
    __syncthreads();  // the stage is in, and every thread has seen out the MMAs that read the slot loaded next
    const int next = chunk + kAhead;
    if (next < t.num_chunks) load_stage<kCols, kRows, kBlockThreads>(smem + next % kDepth * kStageBytes, a, t, next);
    cp_async_commit();
    const uint32_t ws = smem_addr(smem + (chunk % kDepth) * kStageBytes);
    const uint64_t w_desc = wg::smem_desc(ws + group * kWgCols * kLineBytes, 16, 1024);
    const uint64_t x_desc = wg::smem_desc(ws + kCols * kLineBytes, 16, 1024);
    wg::fence_operands(d);
    wg::fence();
#pragma unroll
    for (int kk = 0; kk < kChunk / 16; ++kk) {
      wg::mma_m64k16_ss<kRows>(d, wg::desc_advance(w_desc, 32 * kk), wg::desc_advance(x_desc, 32 * kk), 1);
    }
    wg::commit();
    wg::wait<1>();  // the last chunk's MMAs are done; this one's may run on
    wg::fence_operands(d);
  }
  wg::wait_all();
  wg::fence_operands(d);
  cp_async_wait_all();
  const int warp = threadIdx.x / kWarpSize % 4, lane = threadIdx.x % kWarpSize;
  const int n0 = t.n0 + kWgCols * group;
#pragma unroll
  for (int j = 0; j < kRows / 8; ++j) {
#pragma unroll
    // d[4j + e]: column n0 + 16 warp + lane / 4 + 8 (e / 2), row 8j + 2 (lane % 4) + e % 2
    for (int e = 0; e < 4; ++e) {
      store_output(a, t, 8 * j + 2 * (lane % 4) + e % 2, n0 + 16 * warp + lane / 4 + 8 * (e / 2), d[4 * j + e]);
    }
  }
#endif
}

// float32: warp (row block, n, g) computes out[m, g, n] for kWarpRows rows m; lane l takes k = l, l + 32, ...
__global__ void __launch_bounds__(256) linear_rows_f32(const LinearRowsArgs a) {
  const int warps_per_block = blockDim.x / kWarpSize;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * warps_per_block + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int num_row_blocks = ceil_div(a.num_rows, kWarpRows);
  const int64_t per_group = static_cast<int64_t>(num_row_blocks) * a.num_cols;
  if (item >= per_group * a.num_groups) return;
  const int g = static_cast<int>(item / per_group);
  const int n = static_cast<int>(item % per_group % a.num_cols);
  const int r0 = static_cast<int>(item % per_group / a.num_cols) * kWarpRows;
  int row_begin, row_end;
  group_rows(a, g, row_begin, row_end);
  const int lo = max(r0, row_begin), hi = min(r0 + kWarpRows, row_end);
  if (lo >= hi) return;
  const auto* w = static_cast<const float*>(a.weight) + (static_cast<int64_t>(g) * a.num_cols + n) * a.depth;
  const auto* x = static_cast<const float*>(a.x) + static_cast<int64_t>(g) * a.group_stride;
  float acc[kWarpRows] = {};
  for (int k = lane; k < a.depth; k += kWarpSize) {
    const float wk = w[k];
#pragma unroll
    for (int r = 0; r < kWarpRows; ++r) {
      if (lo + r < hi) acc[r] = fmaf(x[(lo + r) * a.row_stride + k], wk, acc[r]);
    }
  }
  const int og = a.group_ends != nullptr ? 0 : g;
#pragma unroll
  for (int r = 0; r < kWarpRows; ++r) {
    const float sum = warp_sum(acc[r]);
    if (lane == 0 && lo + r < hi) {
      static_cast<float*>(a.out)[(static_cast<int64_t>(lo + r) * a.out_groups + og) * a.num_cols + n] = sum;
    }
  }
}

// out = the splits' partial sums added in split order (rows past the last group's end: zeros).
__global__ void linear_rows_combine(const LinearRowsArgs a) {
  const int64_t size = static_cast<int64_t>(a.num_rows) * a.out_groups * a.num_cols;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size) return;
  const int row = static_cast<int>(i / (static_cast<int64_t>(a.out_groups) * a.num_cols));
  float sum = 0.0f;
  if (a.group_ends == nullptr || row < min(max(a.group_ends[a.num_groups - 1], 0), a.num_rows)) {
    sum = a.partial[i];
    for (int s = 1; s < a.plan.num_splits; ++s) sum += a.partial[s * size + i];
  }
  static_cast<__nv_bfloat16*>(a.out)[i] = __float2bfloat16_rn(sum);
}

// A bfloat16 launch's grid: x the row tiles (grouped_tiles, or each group's row chunks), y the column tiles of each
// split, z the groups (1 when grouped: x walks them).
dim3 row_grid(const LinearRowsArgs& a, int tile_rows, int num_col_tiles) {
  const bool grouped = a.group_ends != nullptr;
  const int tiles = grouped ? grouped_tiles(a.num_rows, a.num_groups, tile_rows) : ceil_div(a.num_rows, tile_rows);
  return dim3(tiles, num_col_tiles * a.plan.num_splits, grouped ? 1 : a.num_groups);
}

template <int kRows, int kGroups>
cudaError_t launch_wgmma(const LinearRowsArgs& a, cudaStream_t stream) {
  const int num_col_tiles = ceil_div(a.num_cols, kGroups * kWgCols);
  constexpr size_t kStageBytes = static_cast<size_t>(kGroups * kWgCols + kRows) * kLineBytes;
  const size_t smem = kWgmmaDepth<kRows, kGroups> * kStageBytes + 1024;  // + the swizzle atoms' alignment
  DDTREE_CUDA_TRY(allow_dynamic_smem(linear_rows_wgmma<kRows, kGroups>, smem));
  const dim3 grid = row_grid(a, kRows, num_col_tiles);
  linear_rows_wgmma<kRows, kGroups><<<grid, kGroups * kThreads, smem, stream>>>(a, num_col_tiles);
  return cudaGetLastError();
}

// The wgmma's N for a call: the rows a group holds (M, or M / G on the average with group_ends), rounded up to one
// of the instruction widths compiled here; past 80 rows, the fewest blocks of at most 256 rows, evened out. Up to 16
// rows a block has one warpgroup (more blocks to stream the weights), past that two (each rows tile serves twice the
// columns). A grouped call of 3 to 8 rows a group on the average takes tiles of 16 in two warpgroups: the touched
// groups hold more than the average (Kimi-K2's 257 tokens: 5.4 a group, 10 a touched one in a DDTree verify), and a
// group's second tile would read its weights again. A row's bits depend on none of it (tests/test_linear_rows_cuda.py).
cudaError_t launch_wgmma_rows(const LinearRowsArgs& a, cudaStream_t stream) {
  const int rows = a.group_ends != nullptr ? ceil_div(a.num_rows, a.num_groups) : a.num_rows;
  if (a.group_ends != nullptr && rows > 2 && rows <= 8) return launch_wgmma<16, 2>(a, stream);
  if (rows <= 8) return launch_wgmma<8, 1>(a, stream);
  if (rows <= 16) return launch_wgmma<16, 1>(a, stream);
  if (rows <= 32) return launch_wgmma<32, 2>(a, stream);
  if (rows <= 64) return launch_wgmma<64, 2>(a, stream);
  if (rows <= 80) return launch_wgmma<80, 2>(a, stream);
  const int per_block = ceil_div(rows, ceil_div(rows, 256));
  return per_block <= 136 ? launch_wgmma<136, 2>(a, stream) : launch_wgmma<256, 2>(a, stream);
}

template <int MT>
cudaError_t launch_mma(const LinearRowsArgs& a, cudaStream_t stream) {
  const int num_col_tiles = ceil_div(a.num_cols, kBlockCols);
  const size_t smem = static_cast<size_t>(kStages) * (kBlockCols + 16 * MT) * kLineBytes;
  DDTREE_CUDA_TRY(allow_dynamic_smem(linear_rows_mma<MT>, smem));
  const dim3 grid = row_grid(a, 16 * MT, num_col_tiles);
  linear_rows_mma<MT><<<grid, kThreads, smem, stream>>>(a, num_col_tiles);
  return cudaGetLastError();
}

}  // namespace

LinearRowsPlan LinearRowsPlanFor(int num_cols, int depth, int num_groups, bool grouped, bool bf16, int num_sms) {
  if (!bf16 || depth <= 0 || grouped) return {1, std::max(depth, 1)};
  const int64_t blocks = static_cast<int64_t>(ceil_div(num_cols, kBlockCols)) * num_groups;
  const int64_t for_the_grid = ceil_div(kMinBlocksPerSm * num_sms, std::max<int64_t>(blocks, 1));
  const int wanted = static_cast<int>(std::min<int64_t>(for_the_grid, std::max(1, depth / kMinSplitDepth)));
  const int split_depth = round_up(ceil_div(depth, std::max(wanted, 1)), kChunk);
  return {ceil_div(depth, split_depth), split_depth};
}

bool LinearRowsWgmmaAvailable() { return tc_sm90::available(); }

size_t LinearRowsPartialElements(const LinearRowsArgs& a) {
  if (!a.bf16 || a.plan.num_splits <= 1) return 0;
  return static_cast<size_t>(a.plan.num_splits) * a.num_rows * a.out_groups * a.num_cols;
}

cudaError_t LinearRows(const LinearRowsArgs& a, cudaStream_t stream) {
  if (a.num_rows == 0 || a.num_cols == 0 || a.num_groups == 0) return cudaSuccess;
  if (!a.bf16) {
    constexpr int kBlock = 256;
    const int64_t warps = static_cast<int64_t>(ceil_div(a.num_rows, kWarpRows)) * a.num_cols * a.num_groups;
    const int64_t blocks = (warps + kBlock / kWarpSize - 1) / (kBlock / kWarpSize);
    if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
    linear_rows_f32<<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(a);
    return cudaGetLastError();
  }
  // One kernel per GPU for every M (mma.sync and wgmma need not round alike). mma.sync's tile rows follow M (an AR
  // step's one row costs one 16-row tile); a row's chain is the same in every tile.
  if (a.kernel != LinearRowsKernel::kMmaSync && LinearRowsWgmmaAvailable()) {
    DDTREE_CUDA_TRY(launch_wgmma_rows(a, stream));
  } else {
    DDTREE_CUDA_TRY(a.num_rows <= 16   ? launch_mma<1>(a, stream)
                    : a.num_rows <= 32 ? launch_mma<2>(a, stream)
                                       : launch_mma<4>(a, stream));
  }
  if (a.plan.num_splits > 1) {
    constexpr int kBlock = 256;
    const int64_t size = static_cast<int64_t>(a.num_rows) * a.out_groups * a.num_cols;
    linear_rows_combine<<<static_cast<unsigned>((size + kBlock - 1) / kBlock), kBlock, 0, stream>>>(a);
    DDTREE_CUDA_TRY(cudaGetLastError());
  }
  return cudaSuccess;
}

}  // namespace ddtree::cuda
