// Who owns which elements in the column / fused quantize kernel (QuantizeColsVec in
// block_scaled_cuda_kernels.h; docs/design.md, "Round 3: the column and fused kernels"). Plain C++ so
// the host can check the mapping (tests/formats/test_quantize_sass.py): every element of a CTA's tile
// owned once, each warp instruction 512 contiguous bytes of one row, a row block whole lanes.
//
// A CTA of Shape::kWarps warps covers B / kCtas rows of one block-row (B rows, blocks down K) x W columns;
// kCtas > 1 CTAs (a thread-block cluster, sm_90) share a block-row and exchange their column maxima
// through distributed shared memory. Lane l of warp w owns one 16-byte piece (E elements) of each of R
// rows: rows RowOf(w) .. RowOf(w) + R - 1 of its CTA's rows, columns PieceOf(w, l) * E .. + E - 1 of the
// tile. T = B / R warps stack along a block (T / kCtas in each CTA), so the 32 lanes of one instruction
// read 32 consecutive pieces of one row.
#pragma once

#include "csrc/common/host_device.h"

namespace gpuext::formats::cols {

// kBoth: the fused kernel, which keeps both codes' parameters live, holds half the rows a lane
// holds in the column kernel, so that it fits the registers of 3 CTAs an SM. Its 128-row blocks
// (FP8_1x128) then need 16 warps along a block: one 512-thread CTA held all of them and was the only
// CTA on its SM (its loads stopped at its barriers, docs/design.md "Round 3"), so they are split over
// a cluster of two 256-thread CTAs, two clusters' CTAs an SM.
template <int kBlock, int kInBytes, bool kBoth>
struct Shape {
  static constexpr int B = kBlock;
  static constexpr int E = 16 / kInBytes;  // elements of one 16-byte piece
  // rows a lane holds: 16 B x R of loads in flight, 4 R (f32, 16-bit) registers of input
  static constexpr int R = (B >= 128 ? 16 : 8) / (kBoth ? 2 : 1);
  static constexpr int T = B / R;                        // warps along a block
  static constexpr int kCtas = T > 8 ? T / 8 : 1;        // CTAs (one cluster) sharing a block-row
  static constexpr int kCtaT = T / kCtas;                // warps along a block in one CTA
  static constexpr int kCtaRows = B / kCtas;             // rows of the block-row one CTA holds
  static constexpr int kWarps = kCtaT > 8 ? kCtaT : 8;  // 256 threads
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kColumnWarps = kWarps / kCtaT;  // warps across the tile
  static constexpr int kPieces = 32 * kColumnWarps;    // pieces across the tile
  static constexpr int W = kPieces * E;                // columns of the tile
  static constexpr int G = B / E;                      // lanes of one row block (fused kernel)
  static_assert(kInBytes == 2 || kInBytes == 4, "16-bit or f32 input");
  static_assert(R <= B && B % R == 0 && T % kCtas == 0 && kWarps % kCtaT == 0, "whole blocks per warp column");
  static_assert(kCtas == 1 || kCtas == 2, "a cluster of at most two CTAs per block-row");
  static_assert(G >= 1 && G <= 32 && 32 % G == 0, "a row block is an aligned group of lanes");
  static_assert(W % B == 0, "a tile holds whole row blocks");
};

// First row (of its CTA's kCtaRows rows of the block-row) that warp w holds; its R rows follow. CTA
// `rank` of a cluster holds rows rank * kCtaRows .. + kCtaRows - 1 of the block-row.
template <class S>
GPUEXT_HD constexpr int RowOf(int warp) {
  return (warp % S::kCtaT) * S::R;
}

// The piece (of the tile's kPieces) that lane l of warp w holds in each of its rows.
template <class S>
GPUEXT_HD constexpr int PieceOf(int warp, int lane) {
  return (warp / S::kCtaT) * 32 + lane;
}

// The token-slot kernel (token_slots_kernel.cuh) stages each column's 128 codes as one 128-byte line
// of eight 16-byte slots, run r (tokens 16 r .. 16 r + 15) in slot TokenSlot(r, line): the 8 lanes of a
// quarter-warp store 8 consecutive pieces' lines (piece = line / E) at once, and the XOR with the
// piece puts them in 8 different bank groups. Its own inverse: TokenSlot(TokenSlot(r, l), l) == r.
template <int E>
GPUEXT_HD constexpr int TokenSlot(int run, int line) {
  return run ^ ((line / E) & 7);
}

}  // namespace gpuext::formats::cols
