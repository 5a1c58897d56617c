// The schedule of the grouped sm_90a kernel (csrc/ragged_dot/hopper_grouped_kernel.cuh), in host
// and device code alike: which row tiles exist for given group sizes (contiguous or masked
// layout), which (row tile, column block) items each persistent CTA computes and which of its
// consumer warpgroups have rows there, and where each of its TMA boxes starts; and the shapes of
// the three tensor maps the host encodes. No CUDA types: g++ builds it on a CPU machine for the schedule
// test (tests/native/hopper_grouped_schedule.cc, tests/ragged_dot/test_ragged_dot_hopper.py), so
// what that test checks is the arithmetic the kernel and the tile-table kernel run.
//
// TMA rules these numbers must keep (cuTensorMapEncodeTiled in cuda.h, and the hardware): every
// dimension in [1, 2^32], strides multiples of 16 bytes, box sides in [1, 256] with the inner side
// a multiple of 16 bytes (and <= 128 bytes under the 128-byte swizzle), int32 coordinates; and
// the INNERMOST coordinate of every load times the element size a multiple of 16 bytes. The last
// one is not in cuTensorMapEncodeTiled's list (it cannot be: coordinates come at run time), but
// sm_90 enforces it: a load that breaks it stops the CTA with an illegal-instruction trap on its
// UTMALDG (triton-lang/triton#7385; Triton's TMA verifier states it, triton-lang/triton#9112). The
// lhs scales are laid out (K/128, M4) with M innermost, so their box starts at the tile's first
// row: for a group starting at a row that is not a multiple of 4 (4 fp32 = 16 bytes) the first
// H200 run trapped (docs/design.md, "Grouped kernel trap on skewed groups"). Their box now starts
// at that row rounded down to a multiple of 4 and is 4 rows longer; the consumers skip the
// 0..3 rows before the tile's first.
#pragma once

#include <cstdint>

#include "csrc/common/host_device.h"

namespace gpuext {

// Row tile t covers rows [row0, min(row0 + tile_rows, row_end)) of group `group`; row_end is the
// group's end (grouped_layout.h GroupTiles holds the table).
struct GroupTile {
  int32_t group, row0, row_end, unused;
};

// Group g's clamped rows (grouped_layout.h): with `end` the unclamped sum of max(size_j, 0) over
// j <= g and `size` = max(size_g, 0), the group owns [start, start + rows), nothing past row m.
struct GroupSpan {
  int64_t start, rows;
};
GPUEXT_HD GroupSpan ClampGroup(int64_t end, int64_t size, int64_t m) {
  const int64_t start = end - size < m ? end - size : m;
  return GroupSpan{start, (end < m ? end : m) - start};
}

// The masked layout (decode: G experts x `capacity` rows, ragged_dot_masked): group g owns rows
// [g * capacity, g * capacity + clamp(size, 0, capacity)); the rows after them are zeroed.
GPUEXT_HD GroupSpan MaskedGroup(int64_t group, int64_t size, int64_t capacity) {
  return GroupSpan{group * capacity, size < 0 ? 0 : (size < capacity ? size : capacity)};
}

// Each group is tiled on its own: ceil(rows / tile_rows) tiles, none for an empty group.
GPUEXT_HD int64_t TilesOfGroup(int64_t rows, int32_t tile_rows) { return (rows + tile_rows - 1) / tile_rows; }

GPUEXT_HD GroupTile TileOfGroup(int64_t group, GroupSpan span, int64_t i, int32_t tile_rows) {
  return GroupTile{static_cast<int32_t>(group), static_cast<int32_t>(span.start + i * tile_rows),
                   static_cast<int32_t>(span.start + span.rows), 0};
}

// sum_g ceil(rows_g / tile_rows) <= ceil(M / tile_rows) + G: the table's size. In the masked
// layout (M = G * capacity) sum_g ceil(rows_g / tile_rows) <= G ceil(capacity / tile_rows) <=
// M / tile_rows + G: the same bound.
GPUEXT_HD int64_t TileCapacity(int64_t m, int64_t groups, int32_t tile_rows) {
  return (m + tile_rows - 1) / tile_rows + groups;
}

namespace hopper_grouped {

// Rows of one tile (two consumer warpgroups of 64): each group is tiled on its own.
inline constexpr int kTileRows = 128;
inline constexpr int kBlockN = 128;  // one 128x128 weight scale block per tile column range
inline constexpr int kBlockK = 128;  // one 128-byte swizzle row of FP8, one scale block along K
inline constexpr int kRasterRows = 8;  // row tiles per rasterisation group (L2 reuse of a weight tile)
// The lhs scale box: its start is rounded down to 4 rows (16 bytes of fp32, the TMA rule above),
// so it holds the tile's 128 rows after 0..3 rows it skips.
inline constexpr int kScaleAlignRows = 4;
inline constexpr int kScaleBoxRows = kTileRows + kScaleAlignRows;
// Bytes the three loads of one K tile bring (TMA counts a box's zero-filled parts too): the
// producer's expect_tx.
inline constexpr int kStageTxBytes = kTileRows * kBlockK + kBlockN * kBlockK + kScaleBoxRows * 4;
// Rows of one consumer warpgroup (one m64 wgmma): the tile's rows [64 wg, 64 wg + 64).
inline constexpr int kWarpgroupRows = 64;

// K tiles of 128: the last one may be partial (K % 16 == 0 only: TMA's 16-byte row strides); TMA
// zero-fills A and B past K, so its missing products add 0.
GPUEXT_HD int64_t KTiles(int64_t k) { return (k + kBlockK - 1) / kBlockK; }

// The persistent grid: one CTA per SM at most, never more CTAs than items the largest tile table
// can give (capacity row tiles x column blocks). CTA b computes items b, b + grid, b + 2 grid, ...
// below count x column blocks, `count` being the tile table's (read on the device).
GPUEXT_HD int64_t PersistentGrid(int64_t capacity, int64_t n, int64_t sms) {
  const int64_t items = capacity * ((n + kBlockN - 1) / kBlockN);
  return items < sms ? items : sms;
}

// Whether consumer warpgroup `wg` has rows of the tile's group: a tail of <= 64 rows leaves the
// second warpgroup idle (it skips its wgmma but still waits on and releases every stage).
GPUEXT_HD bool WarpgroupActive(const GroupTile& tile, int wg) { return tile.row0 + kWarpgroupRows * wg < tile.row_end; }

// The (row tile, first column) of item `item` of `tiles` row tiles: consecutive items take
// kRasterRows row tiles for one column block, then the next column block (hopper_mx's
// rasterisation); a bijection of [0, tiles x column blocks). Row tiles of one expert are adjacent
// in the table, so its weight tile is read once from HBM, then from L2.
struct CtaTile {
  int t, n0;
};
GPUEXT_HD CtaTile CtaTileOf(int item, int tiles, int n) {
  const int tiles_n = (n + kBlockN - 1) / kBlockN;
  const int per_group = kRasterRows * tiles_n;
  const int first = (item / per_group) * kRasterRows;
  const int rows = tiles - first < kRasterRows ? tiles - first : kRasterRows;
  const int in_group = item % per_group;
  return CtaTile{first + in_group % rows, (in_group / rows) * kBlockN};
}

// Where the three boxes of K tile kt of a tile start, innermost coordinate first (the third
// coordinate is always 0), and the scale rows the consumers skip.
struct TmaCoord {
  int32_t c0, c1;
};
struct TileLoads {
  TmaCoord a;           // lhs (M, K): K, row
  TmaCoord b;           // rhs as (G * N, K): K, row
  TmaCoord sa;          // lhs scales (K/128, M4): row (16-byte aligned), K tile
  int32_t scale_skip;   // the tile's first row is row scale_skip of the scale box
};
GPUEXT_HD TileLoads LoadsOf(const GroupTile& tile, int n0, int kt, int n) {
  TileLoads l;
  l.a = TmaCoord{kt * kBlockK, tile.row0};
  l.b = TmaCoord{kt * kBlockK, tile.group * n + n0};
  l.sa = TmaCoord{tile.row0 & ~(kScaleAlignRows - 1), kt};
  l.scale_skip = tile.row0 & (kScaleAlignRows - 1);
  return l;
}

// A 3-D tensor map over a row-major [d2, d1, d0] array (hopper_mx/tensor_map.h Encode3d: strides
// d0 * elem and d0 * d1 * elem bytes) with box [1, box1, box0].
struct MapShape {
  int64_t d0, d1, d2;
  int32_t box0, box1;
  int32_t elem_bytes;
  bool swizzle_128b;
};
struct MapShapes {
  MapShape a, b, sa;
};
// Only for m, n, groups > 0 (Launch encodes no map otherwise: a dimension of 0 is not encodable).
inline MapShapes TensorMapShapes(int64_t m, int64_t n, int64_t k, int64_t groups) {
  MapShapes s;
  s.a = MapShape{k, m, 1, kBlockK, kTileRows, 1, true};
  s.b = MapShape{k, groups * n, 1, kBlockK, kBlockN, 1, true};
  s.sa = MapShape{(m + 3) / 4 * 4, KTiles(k), 1, kScaleBoxRows, 1, 4, false};
  return s;
}

// ---------------------------------------------------------------------------- the weight gradient
// RAGGED_CONTRACT: out[g] (K x N) = sum over group g's 128-token blocks b of
//   (A[:, block b] s_a[b, :]) (B[:, block b] s_b[b, :])^T,
// A = x^T (K, S) and B = dy^T (N, S) in the padded slot layout (S = 128 x blocks, block b at tokens
// [128 b, 128 b + 128), zeros where a block has fewer tokens; jax_gpuext/ragged_dot/common.py
// slot_rows), tokens contiguous, so every box starts 16-byte aligned wherever a group starts.
// Group g's blocks are [tile_start[g], tile_start[g + 1]) of the tile table built with 128-row
// tiles over the M tokens: the same compact numbering as the scales of quantize_grouped
// (common.grouped_layout's block_start), which the CPU test checks against each other.
// Scales: s_a (blocks, round_up(K, 4)) and s_b (blocks, round_up(N, 4)) fp32, the grouped
// arrays' own scales transposed so that 128 rows of one block are one TMA box.
inline constexpr int kWgradStageTxBytes = kTileRows * kBlockK + kBlockN * kBlockK + (kTileRows + kBlockN) * 4;

// Item `item` of the wgrad grid: (group, first row of K, first column of N). Items run group after
// group (concurrent CTAs share a group's token blocks in L2), and within a group in kRasterRows-row
// rasterisation groups as CtaTileOf.
struct WgradItem {
  int g, m0, n0;
};
GPUEXT_HD int64_t WgradItems(int64_t groups, int64_t k, int64_t n) {
  return groups * ((k + kTileRows - 1) / kTileRows) * ((n + kBlockN - 1) / kBlockN);
}
GPUEXT_HD WgradItem WgradItemOf(int item, int k, int n) {
  const int per_group = ((k + kTileRows - 1) / kTileRows) * ((n + kBlockN - 1) / kBlockN);
  const CtaTile t = CtaTileOf(item % per_group, (k + kTileRows - 1) / kTileRows, n);
  return WgradItem{item / per_group, t.t * kTileRows, t.n0};
}
GPUEXT_HD int64_t WgradGrid(int64_t groups, int64_t k, int64_t n, int64_t sms) {
  const int64_t items = WgradItems(groups, k, n);
  return items < sms ? items : sms;
}
// Whether consumer warpgroup `wg` has rows of K in the item (K % 128 != 0: the last row tile's
// second warpgroup may have none).
GPUEXT_HD bool WgradWarpgroupActive(const WgradItem& it, int wg, int k) { return it.m0 + kWarpgroupRows * wg < k; }

struct WgradLoads {
  TmaCoord a;   // A (K, S): token, row of K
  TmaCoord b;   // B (N, S): token, row of N
  TmaCoord sa;  // s_a (blocks, K4): row of K, block
  TmaCoord sb;  // s_b (blocks, N4): row of N, block
};
GPUEXT_HD WgradLoads WgradLoadsOf(const WgradItem& it, int block) {
  WgradLoads l;
  l.a = TmaCoord{block * kBlockK, it.m0};
  l.b = TmaCoord{block * kBlockK, it.n0};
  l.sa = TmaCoord{it.m0, block};
  l.sb = TmaCoord{it.n0, block};
  return l;
}

struct WgradMapShapes {
  MapShape a, b, sa, sb;
};
// Only for k, n, blocks > 0 (LaunchWgrad encodes no map otherwise and writes the zeros directly).
inline WgradMapShapes WgradTensorMapShapes(int64_t k, int64_t n, int64_t blocks) {
  const int64_t slots = blocks * kBlockK;
  WgradMapShapes s;
  s.a = MapShape{slots, k, 1, kBlockK, kTileRows, 1, true};
  s.b = MapShape{slots, n, 1, kBlockK, kBlockN, 1, true};
  s.sa = MapShape{(k + 3) / 4 * 4, blocks, 1, kTileRows, 1, 4, false};
  s.sb = MapShape{(n + 3) / 4 * 4, blocks, 1, kBlockN, 1, 4, false};
  return s;
}

}  // namespace hopper_grouped
}  // namespace gpuext
