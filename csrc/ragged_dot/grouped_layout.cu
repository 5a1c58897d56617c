#include "csrc/ragged_dot/grouped_layout.h"

#include <algorithm>

#include "csrc/common/cuda_check.h"

namespace gpuext {

namespace {

constexpr int kScanThreads = 1024;  // one block scans the group sizes, 1024 groups per step
constexpr int kCopyThreads = 128;   // one block per row: 16-byte copies along K (or N), K-blocks of scales
constexpr int64_t kMaxCopyBlocks = 4096;
constexpr unsigned kFullMask = 0xffffffffu;

__host__ __device__ int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
int64_t ScaleRowAlign(int32_t row_align) { return std::max<int64_t>(row_align, 4); }

// Inclusive prefix sum of one value per thread over the block (blockDim.x a multiple of 32).
__device__ int64_t BlockInclusiveSum(int64_t v, int64_t* warp_totals) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int d = 1; d < 32; d <<= 1) {
    const int64_t t = __shfl_up_sync(kFullMask, v, d);
    if (lane >= d) v += t;
  }
  if (lane == 31) warp_totals[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int64_t w = lane < warps ? warp_totals[lane] : 0;
    for (int d = 1; d < 32; d <<= 1) {
      const int64_t t = __shfl_up_sync(kFullMask, w, d);
      if (lane >= d) w += t;
    }
    if (lane < warps) warp_totals[lane] = w;
  }
  __syncthreads();
  if (warp > 0) v += warp_totals[warp - 1];
  __syncthreads();  // warp_totals is reused by the next call
  return v;
}

// The last group g in [0, groups) with starts[g] <= row, for row < starts[groups]: the group
// that owns the row (empty groups share their start with the next one and lose the tie).
__device__ int64_t OwningGroup(const int64_t* starts, int64_t groups, int64_t row) {
  int64_t lo = 0, hi = groups - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (starts[mid] <= row) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// One step of the one-block scan over the group sizes: the group of this thread (g, or none past
// the last) gets its clamped rows [*start, *start + *rows): negative sizes count 0, nothing passes
// row m, whatever the device array holds. `carry` is the unclamped row total of earlier steps;
// returns this thread's unclamped inclusive total (the last thread's is the next step's carry).
__device__ int64_t ClampedGroupRows(const int32_t* sizes, int64_t groups, int64_t m, int64_t g, int64_t carry,
                                    int64_t* warp_totals, int64_t* start, int64_t* rows) {
  const int64_t size = g < groups ? max(sizes[g], 0) : 0;
  const int64_t end = BlockInclusiveSum(size, warp_totals) + carry;  // unclamped, fits int64
  const GroupSpan span = ClampGroup(end, size, m);
  *start = span.start;
  *rows = span.rows;
  return end;
}

// One block: the arrays cuBLASLt reads, and the offsets the other kernels search.
__global__ void GroupedSetupKernel(RaggedGemm p, GroupedWorkspace ws) {
  __shared__ int64_t warp_totals[32];
  __shared__ int64_t carry[2];  // rows and padded rows of the groups of earlier steps
  const GroupedArrays& a = ws.arrays;
  const int64_t kb = KBlocks(p.k);
  const int64_t scale_align = p.row_align > 4 ? p.row_align : 4;
  const bool padded_mode = ws.lhs != nullptr;
  if (threadIdx.x == 0) carry[0] = carry[1] = 0;
  __syncthreads();
  for (int64_t first = 0; first < p.groups; first += blockDim.x) {
    const int64_t g = first + threadIdx.x;
    const int64_t carry_rows = carry[0], carry_padded = carry[1];
    int64_t start = 0, rows = 0;
    const int64_t end = ClampedGroupRows(p.group_sizes, p.groups, p.m, g, carry_rows, warp_totals, &start, &rows);
    const int64_t padded = RoundUp(rows, scale_align);  // rows of the group in the scale layout
    const int64_t padded_end = BlockInclusiveSum(padded, warp_totals) + carry_padded;
    const int64_t padded_start = padded_end - padded;
    if (g < p.groups) {
      const int32_t n_g = static_cast<int32_t>(RoundUp(rows, p.row_align));  // cuBLAS's n of group g
      a.a[g] = p.rhs + g * p.n * p.k;
      a.a_scale[g] = p.rhs_scale + g * p.rhs_scale_floats;
      a.b[g] = padded_mode ? ws.lhs + padded_start * p.k : p.lhs + start * p.k;
      a.d[g] = static_cast<char*>(padded_mode ? ws.out : p.out) +
               (padded_mode ? padded_start : start) * p.n * static_cast<int64_t>(p.out_elem_bytes);
      a.b_scale[g] = ws.lhs_scale + padded_start * kb;
      a.a_rows[g] = static_cast<int32_t>(p.k);
      a.a_cols[g] = static_cast<int32_t>(p.n);
      a.lda[g] = static_cast<int32_t>(p.k);
      a.b_rows[g] = static_cast<int32_t>(p.k);
      a.b_cols[g] = n_g;
      a.ldb[g] = static_cast<int32_t>(p.k);
      a.d_rows[g] = static_cast<int32_t>(p.n);
      a.d_cols[g] = n_g;
      a.ldd[g] = static_cast<int32_t>(p.n);
      a.row_start[g] = start;
      a.packed_start[g] = padded_start;
    }
    if (threadIdx.x == blockDim.x - 1) {  // threads past the last group added 0: the totals so far
      carry[0] = end;
      carry[1] = padded_end;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    a.row_start[p.groups] = min(carry[0], p.m);
    a.packed_start[p.groups] = carry[1];
  }
}

// One padded row per block iteration: its K-block scales into the group's VEC128 layout
// (K-blocks x padded rows, rows fastest) and, in the padded mode, its K bytes. Rows a group
// pads with get scale 0 and data 0 (their outputs are never read; zeros keep them finite).
__global__ void GroupedPackKernel(RaggedGemm p, GroupedWorkspace ws, int64_t capacity) {
  const GroupedArrays& a = ws.arrays;
  const int64_t total = min(a.packed_start[p.groups], capacity);
  const int64_t kb = KBlocks(p.k);
  for (int64_t row = blockIdx.x; row < total; row += gridDim.x) {
    const int64_t g = OwningGroup(a.packed_start, p.groups, row);
    const int64_t i = row - a.packed_start[g];
    const int64_t padded_g = a.packed_start[g + 1] - a.packed_start[g];
    const bool real = i < a.row_start[g + 1] - a.row_start[g];
    const int64_t src = a.row_start[g] + i;
    float* scale = ws.lhs_scale + a.packed_start[g] * kb + i;
    for (int64_t b = threadIdx.x; b < kb; b += blockDim.x) {
      scale[b * padded_g] = real ? p.lhs_scale[src * kb + b] : 0.0f;
    }
    if (ws.lhs != nullptr) {
      uint4* dst = reinterpret_cast<uint4*>(ws.lhs + row * p.k);
      const uint4* from = reinterpret_cast<const uint4*>(p.lhs + src * p.k);
      for (int64_t c = threadIdx.x; c < p.k / 16; c += blockDim.x) dst[c] = real ? from[c] : make_uint4(0, 0, 0, 0);
    }
  }
}

// Rows of out: those past the groups (from row_start[groups]) zeroed; with a padded output, the
// others copied from it (group g's row i sits at padded row packed_start[g] + i).
__global__ void FinishRowsKernel(void* out, int64_t m, int64_t chunks, const int64_t* row_start,
                                 const int64_t* packed_start, int64_t groups, const void* padded_out) {
  const int64_t total = row_start[groups];
  const int64_t first = padded_out != nullptr ? 0 : total;  // in place: the matmul wrote rows < total
  for (int64_t r = first + blockIdx.x; r < m; r += gridDim.x) {
    uint4* dst = reinterpret_cast<uint4*>(out) + r * chunks;
    if (r >= total) {
      for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) dst[c] = make_uint4(0, 0, 0, 0);
      continue;
    }
    const int64_t g = OwningGroup(row_start, groups, r);
    const uint4* from = reinterpret_cast<const uint4*>(padded_out) + (packed_start[g] + r - row_start[g]) * chunks;
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) dst[c] = from[c];
  }
}

// One block: row_start, tile_start and the table of row tiles (tile_rows rows of one group each),
// in the contiguous layout (capacity < 0) or the masked one.
__global__ void GroupedTilesKernel(const int32_t* sizes, int64_t groups, int64_t m, int32_t tile_rows,
                                   int64_t capacity, GroupTile* tiles, int32_t* tile_count, int64_t* row_start,
                                   int32_t* tile_start) {
  __shared__ int64_t warp_totals[32];
  __shared__ int64_t carry[2];  // rows and tiles of the groups of earlier steps
  if (threadIdx.x == 0) carry[0] = carry[1] = 0;
  __syncthreads();
  for (int64_t first = 0; first < groups; first += blockDim.x) {
    const int64_t g = first + threadIdx.x;
    const int64_t carry_rows = carry[0], carry_tiles = carry[1];
    int64_t start = 0, rows = 0, end = 0;
    if (capacity < 0) {
      end = ClampedGroupRows(sizes, groups, m, g, carry_rows, warp_totals, &start, &rows);
    } else if (g < groups) {
      const GroupSpan span = MaskedGroup(g, sizes[g], capacity);
      start = span.start;
      rows = span.rows;
    }
    const int64_t n_tiles = TilesOfGroup(rows, tile_rows);  // 0 for an empty group
    const int64_t tiles_end = BlockInclusiveSum(n_tiles, warp_totals) + carry_tiles;
    if (g < groups) {
      row_start[g] = start;
      tile_start[g] = static_cast<int32_t>(tiles_end - n_tiles);
      for (int64_t i = 0; i < n_tiles; ++i) {
        tiles[tiles_end - n_tiles + i] = TileOfGroup(g, GroupSpan{start, rows}, i, tile_rows);
      }
    }
    if (threadIdx.x == blockDim.x - 1) {
      carry[0] = end;
      carry[1] = tiles_end;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    row_start[groups] = capacity < 0 ? min(carry[0], m) : m;
    tile_start[groups] = static_cast<int32_t>(carry[1]);
    *tile_count = static_cast<int32_t>(carry[1]);
  }
}

// The masked layout's rows at or past their group's count: zeros (16-byte stores).
__global__ void ZeroMaskedRowsKernel(void* out, int64_t groups, int64_t capacity, int64_t chunks,
                                     const int32_t* sizes) {
  const int64_t rows = groups * capacity;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t g = r / capacity;
    if (r - g * capacity < MaskedGroup(g, sizes[g], capacity).rows) continue;
    uint4* dst = reinterpret_cast<uint4*>(out) + r * chunks;
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) dst[c] = make_uint4(0, 0, 0, 0);
  }
}

int Blocks(int64_t rows) { return static_cast<int>(std::min(std::max<int64_t>(rows, 1), kMaxCopyBlocks)); }

}  // namespace

int64_t PaddedRowCapacity(int64_t m, int64_t groups, int32_t row_align) {
  return m + groups * (ScaleRowAlign(row_align) - 1);
}

namespace {

// Walks the sections in order; with base == nullptr it only counts (GroupedWorkspaceBytes).
struct Carver {
  char* base;
  size_t offset = 0;
  template <typename T>
  T* Take(size_t bytes) {
    T* at = base == nullptr ? nullptr : reinterpret_cast<T*>(base + offset);
    offset += (bytes + kGroupedWorkspaceAlignment - 1) / kGroupedWorkspaceAlignment * kGroupedWorkspaceAlignment;
    return at;
  }
};

GroupedWorkspace Carve(char* base, const RaggedGemm& p, size_t* total) {
  Carver c{base};
  GroupedWorkspace ws;
  GroupedArrays& a = ws.arrays;
  const size_t g = static_cast<size_t>(p.groups);
  ws.cublas = c.Take<char>(kGroupedCublasWorkspaceBytes);
  a.a = c.Take<const void*>(g * sizeof(void*));
  a.b = c.Take<const void*>(g * sizeof(void*));
  a.d = c.Take<void*>(g * sizeof(void*));
  a.a_scale = c.Take<const void*>(g * sizeof(void*));
  a.b_scale = c.Take<const void*>(g * sizeof(void*));
  for (int32_t** arr : {&a.a_rows, &a.a_cols, &a.lda, &a.b_rows, &a.b_cols, &a.ldb, &a.d_rows, &a.d_cols, &a.ldd})
    *arr = c.Take<int32_t>(g * sizeof(int32_t));
  a.row_start = c.Take<int64_t>((g + 1) * sizeof(int64_t));
  a.packed_start = c.Take<int64_t>((g + 1) * sizeof(int64_t));
  const size_t capacity = static_cast<size_t>(PaddedRowCapacity(p.m, p.groups, p.row_align));
  ws.lhs_scale = c.Take<float>(capacity * static_cast<size_t>(KBlocks(p.k)) * sizeof(float));
  if (p.row_align > 1) {
    ws.lhs = c.Take<uint8_t>(capacity * static_cast<size_t>(p.k));
    ws.out = c.Take<char>(capacity * static_cast<size_t>(p.n) * p.out_elem_bytes);
  }
  *total = c.offset;
  return ws;
}

}  // namespace

size_t GroupedWorkspaceBytes(const RaggedGemm& p) {
  size_t total = 0;
  Carve(nullptr, p, &total);
  return total;
}

GroupedWorkspace CarveGroupedWorkspace(void* base, const RaggedGemm& p) {
  size_t total = 0;
  return Carve(static_cast<char*>(base), p, &total);
}

Status LaunchGroupedPrepare(const RaggedGemm& p, const GroupedWorkspace& ws, cudaStream_t stream) {
  cudaGetLastError();  // an error some earlier, unrelated launch left pending is not ours to report
  GroupedSetupKernel<<<1, kScanThreads, 0, stream>>>(p, ws);
  GPUEXT_CUDA_RETURN_IF_LAUNCH_ERROR("GroupedSetupKernel");
  const int64_t capacity = PaddedRowCapacity(p.m, p.groups, p.row_align);
  GroupedPackKernel<<<Blocks(capacity), kCopyThreads, 0, stream>>>(p, ws, capacity);
  GPUEXT_CUDA_RETURN_IF_LAUNCH_ERROR("GroupedPackKernel");
  return Status::Ok();
}

Status LaunchGroupedFinish(const RaggedGemm& p, const GroupedWorkspace& ws, cudaStream_t stream) {
  return LaunchFinishRows(p.out, p.m, p.n * static_cast<int64_t>(p.out_elem_bytes), ws.arrays.row_start,
                          ws.arrays.packed_start, p.groups, ws.out, stream);
}

Status LaunchFinishRows(void* out, int64_t m, int64_t row_bytes, const int64_t* row_start,
                        const int64_t* packed_start, int64_t groups, const void* padded_out, cudaStream_t stream) {
  FinishRowsKernel<<<Blocks(m), kCopyThreads, 0, stream>>>(out, m, row_bytes / 16, row_start, packed_start, groups,
                                                           padded_out);
  GPUEXT_CUDA_RETURN_IF_LAUNCH_ERROR("FinishRowsKernel");
  return Status::Ok();
}

Status LaunchGroupedTiles(const int32_t* group_sizes, int64_t groups, int64_t m, int32_t tile_rows,
                          int64_t capacity, const GroupTiles& out, cudaStream_t stream) {
  cudaGetLastError();  // an error some earlier, unrelated launch left pending is not ours to report
  GroupedTilesKernel<<<1, kScanThreads, 0, stream>>>(group_sizes, groups, m, tile_rows, capacity, out.tiles,
                                                      out.count, out.row_start, out.tile_start);
  GPUEXT_CUDA_RETURN_IF_LAUNCH_ERROR("GroupedTilesKernel");
  return Status::Ok();
}

Status LaunchZeroMaskedRows(void* out, int64_t groups, int64_t capacity, int64_t row_bytes,
                            const int32_t* group_sizes, cudaStream_t stream) {
  if (groups == 0 || capacity == 0 || row_bytes == 0) return Status::Ok();
  ZeroMaskedRowsKernel<<<Blocks(groups * capacity), kCopyThreads, 0, stream>>>(out, groups, capacity, row_bytes / 16,
                                                                               group_sizes);
  GPUEXT_CUDA_RETURN_IF_LAUNCH_ERROR("ZeroMaskedRowsKernel");
  return Status::Ok();
}

}  // namespace gpuext
