// The device-side bookkeeping of a grouped (ragged) FP8 blockwise matmul through cuBLASLt's
// grouped GEMM: raw pointers, sizes, a stream. No cuBLAS types here (csrc/ragged_dot/
// cublaslt_grouped.cc owns the library calls), so this compiles with nvcc alone.
//
//   out[r, :] = sum_k lhs[r, k] s_lhs[r, k/128] * rhs[g(r), :, k] s_rhs(g(r), ., k/128)
//
// lhs (M, K) rows grouped contiguously by group_sizes (G,) int32, which stays on the device:
// group g owns rows [start_g, start_g + rows_g), start_g = min(sum_{j<g} max(size_j, 0), M),
// rows_g = min(start_g + max(size_g, 0), M) - start_g. Whatever the sizes hold, no group reaches
// past row M, and rows from sum(rows_g) to M are written as zeros. rhs (G, N, K), out (M, N).
//
// Two kernels around the cuBLASLt call, both on the caller's stream and sized from the static
// shapes only (the same launches every call: CUDA-graph safe):
//  - LaunchGroupedPrepare: a one-block scan of the group sizes writes the per-group pointer and
//    shape arrays cuBLASLt reads, then the lhs scales are rearranged into the per-group VEC128
//    layout (for cuBLAS's B operand: K-blocks x round_up(rows, 4) floats, rows fastest) and, with
//    row_align 16, the lhs rows are copied into a buffer where each group starts on a 16-row
//    boundary (zero padding rows), the alignment cuBLAS asks of every grouped m, n, k.
//  - LaunchGroupedFinish: with row_align 16 copies each group's rows from the padded output
//    buffer into out; in both modes zeroes the rows past sum(rows_g).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "csrc/common/host_device.h"
#include "csrc/common/status.h"
#include "csrc/ragged_dot/hopper_grouped_schedule.h"

namespace gpuext {

// cuBLAS recommends 32 MiB of workspace on Hopper (and TransformerEngine's grouped GEMM gives it that).
constexpr size_t kGroupedCublasWorkspaceBytes = size_t{32} << 20;
// Every section of the workspace starts on this boundary (cuBLASLt's own workspace needs 256).
constexpr size_t kGroupedWorkspaceAlignment = 256;
// Rows per group the padded layout aligns to: 16 bytes of FP8 (the CUDALibrarySamples grouped
// GEMM samples: "Grouped GEMM requires m, n, k to be 16 bytes aligned").
constexpr int32_t kGroupedPaddedRowAlign = 16;

// The arrays cuBLASLt's grouped layouts and scale pointers read (device memory, per group).
// cuBLAS's A is our rhs (stored K x N per group, op T), its B our lhs (K x rows, op N), D out^T.
struct GroupedArrays {
  const void** a = nullptr;
  const void** b = nullptr;
  void** d = nullptr;  // also passed as C (beta = 0, never read)
  const void** a_scale = nullptr;
  const void** b_scale = nullptr;
  int32_t *a_rows = nullptr, *a_cols = nullptr, *lda = nullptr;
  int32_t *b_rows = nullptr, *b_cols = nullptr, *ldb = nullptr;
  int32_t *d_rows = nullptr, *d_cols = nullptr, *ldd = nullptr;
  int64_t* row_start = nullptr;     // G + 1: start_g; [G] = sum(rows_g)
  int64_t* packed_start = nullptr;  // G + 1: first row of group g in the padded (and scale) layout
};

// One call's operands and shape. row_align 1 runs cuBLASLt on the groups in place (group sizes
// as they are); 16 runs it on the padded copies.
struct RaggedGemm {
  int64_t m = 0, n = 0, k = 0, groups = 0;
  int32_t row_align = kGroupedPaddedRowAlign;
  size_t out_elem_bytes = 2;
  const int32_t* group_sizes = nullptr;  // device
  const uint8_t* lhs = nullptr;          // (M, K) E4M3
  const float* lhs_scale = nullptr;      // (M, K/128)
  const uint8_t* rhs = nullptr;          // (G, N, K) E4M3
  const float* rhs_scale = nullptr;      // (G, rhs_scale_floats) in cuBLAS's layout for its mode
  int64_t rhs_scale_floats = 0;          // per group
  void* out = nullptr;                   // (M, N)
};

// The workspace carved into its sections (all pointers into one buffer).
struct GroupedWorkspace {
  void* cublas = nullptr;  // kGroupedCublasWorkspaceBytes
  GroupedArrays arrays;
  float* lhs_scale = nullptr;    // per-group VEC128 scales, capacity ScaleRowCapacity rows
  uint8_t* lhs = nullptr;        // row_align 16: padded lhs rows (else null)
  void* out = nullptr;           // row_align 16: padded out rows (else null)
};

GPUEXT_HD int64_t KBlocks(int64_t k) { return (k + 127) / 128; }
// Rows the padded layout can need: sum_g round_up(rows_g, max(row_align, 4)) <= M + G * (that - 1).
int64_t PaddedRowCapacity(int64_t m, int64_t groups, int32_t row_align);
// Bytes of the workspace result (before the kGroupedWorkspaceAlignment of slack the handler
// spends to align its start). jax_gpuext/ragged_dot/cublaslt.py computes the same number.
size_t GroupedWorkspaceBytes(const RaggedGemm& p);
// Splits `base` (kGroupedWorkspaceAlignment-aligned, GroupedWorkspaceBytes(p) long) into sections.
GroupedWorkspace CarveGroupedWorkspace(void* base, const RaggedGemm& p);

// The scan, the pointer/shape arrays and the lhs re-layout, before the cuBLASLt call.
Status LaunchGroupedPrepare(const RaggedGemm& p, const GroupedWorkspace& ws, cudaStream_t stream);
// The padded output copied back (row_align 16) and the rows past the groups zeroed.
Status LaunchGroupedFinish(const RaggedGemm& p, const GroupedWorkspace& ws, cudaStream_t stream);

// Rows of `out` (m rows of row_bytes, a multiple of 16) from row_start[groups] on zeroed; with
// `padded_out`, the rows before copied from it (row i of group g at padded row packed_start[g] + i).
Status LaunchFinishRows(void* out, int64_t m, int64_t row_bytes, const int64_t* row_start,
                        const int64_t* packed_start, int64_t groups, const void* padded_out, cudaStream_t stream);

// Row tiles for a kernel that tiles each group on its own (csrc/ragged_dot/hopper_grouped.h): the
// tiles (GroupTile), their clamping and TileCapacity live in hopper_grouped_schedule.h, in host and
// device code, so the CPU schedule test checks the arithmetic this scan runs.
struct GroupTiles {
  GroupTile* tiles = nullptr;    // TileCapacity entries; the first *count are valid
  int32_t* count = nullptr;
  int64_t* row_start = nullptr;  // G + 1, as GroupedArrays::row_start (contiguous layout)
  int32_t* tile_start = nullptr;  // G + 1: group g's tiles are [tile_start[g], tile_start[g + 1])
};
// One block scans the sizes into the tile table, its count, row_start and tile_start. capacity < 0:
// the contiguous layout (groups one after the other, clamped as above); capacity >= 0: the masked
// layout, group g at row g * capacity with clamp(size, 0, capacity) rows (MaskedGroup), m = G * capacity.
Status LaunchGroupedTiles(const int32_t* group_sizes, int64_t groups, int64_t m, int32_t tile_rows,
                          int64_t capacity, const GroupTiles& out, cudaStream_t stream);

// The masked layout's rows past each group's count, out being (groups * capacity) rows of
// row_bytes (a multiple of 16), written as zeros.
Status LaunchZeroMaskedRows(void* out, int64_t groups, int64_t capacity, int64_t row_bytes,
                            const int32_t* group_sizes, cudaStream_t stream);

}  // namespace gpuext
