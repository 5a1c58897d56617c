// The grouped kernel: hopper_mx's pipeline (TMA -> shared memory -> FP8 wgmma -> promotion) with
// the DeepSeek-V3 block sizes and a tile table in place of a dense grid.
//
// One CTA = one producer warpgroup + two consumer warpgroups (64 rows each), one output tile of
// 128 rows of ONE group x 128 columns. The tile table (grouped_layout.h GroupTiles, written on the
// stream by a one-block scan of the group sizes) says which group and rows; CTAs past its count
// return at once, so the grid is sized from the static shapes (ceil(M/128) + G row tiles).
//
// Per 128-wide K tile a consumer runs four m64n128k32 wgmma into `part` (the first overwrites,
// the others accumulate: part = the tile's 128 products per element, in the tensor cores' own
// accumulator), waits, and promotes once: acc += part * (s_lhs[row] * s_rhs), s_rhs being the one
// 128x128 weight scale the tile's columns share. Promoting every 128 of K is DeepSeek-V3's fix
// for the FP8 tensor cores' short accumulator; it costs one FFMA per accumulator per K tile, a
// quarter of hopper_mx's per-32 promotion, the instruction count that bounded hopper_mx.
//
// Rows: a tile's 128 rows start at the group's row0; rows past the group's end (the next group's,
// or TMA's zero fill past M) are computed with this group's weights and never stored. So groups
// need no alignment and nothing is copied. Columns past N: zero-filled weights of the next
// expert's rows or past the end, not stored either. K % 128 == 0: every K tile is whole.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "csrc/hopper_mx/hopper_mx_kernel.cuh"  // StorePair, kGroupM, PTX and wgmma wrappers
#include "csrc/ragged_dot/grouped_layout.h"

namespace gpuext::hopper_grouped {

namespace hmx = ::gpuext::hopper_mx;

inline constexpr int kBlockN = 128;  // one 128x128 weight scale block per tile column range
inline constexpr int kBlockK = 128;  // one 128-byte swizzle row of FP8, one scale block along K
inline constexpr int kConsumers = kTileRows / 64;
inline constexpr int kStages = 6;

struct Smem {
  static constexpr int kABytes = kTileRows * kBlockK;  // FP8: one byte per element
  static constexpr int kBBytes = kBlockN * kBlockK;
  static constexpr int kSaBytes = kTileRows * 4;       // one fp32 lhs scale per row per K tile
  static constexpr int kStageTx = kABytes + kBBytes + kSaBytes;
  static constexpr int kA = 0;  // A and B first: every tile on a 1024-byte boundary (swizzle atoms)
  static constexpr int kB = kA + kStages * kABytes;
  static constexpr int kSa = kB + kStages * kBBytes;
  static constexpr int kBars = kSa + kStages * kSaBytes;
  static constexpr int kEnd = kBars + 2 * kStages * 8;
  static constexpr int kBytes = kEnd + 1024;  // the dynamic window is only 16-byte aligned
  static_assert(kABytes % 1024 == 0 && kBBytes % 1024 == 0, "tiles must keep 1024-byte alignment");
  static_assert(kSaBytes % 128 == 0, "TMA destinations need 128-byte alignment");
  static_assert(kBytes <= 227 * 1024, "exceeds the 227 KB of shared memory a Hopper CTA can have");
};

struct Args {
  void* out;
  int n;
  int k_tiles;          // K / 128
  int n_blocks;         // ceil(N / 128): the rhs scales' middle dimension
  int out_type;         // hopper_mx::OutType
  int tiles_max;        // row tiles the grid covers (TileCapacity)
  const GroupTile* tiles;
  const int32_t* tile_count;
  const float* rhs_scale;  // (G, n_blocks, k_tiles)
};

__global__ void __launch_bounds__(128 * (kConsumers + 1), 1)
    GroupedFp8Kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                     const __grid_constant__ CUtensorMap map_sa, const Args args) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kAccRegs = kBlockN / 2;  // m64n128 f32 accumulator: 64 registers per thread

  // Grouped rasterisation (hopper_mx's): consecutive CTAs take kGroupM row tiles for one column
  // tile, then the next column tile; row tiles of one expert are adjacent in the table, so its
  // weight tile is read once from HBM and then from L2.
  const int tiles_n = (args.n + kBlockN - 1) / kBlockN;
  const int per_group = hmx::kGroupM * tiles_n;
  const int first_m = (blockIdx.x / per_group) * hmx::kGroupM;
  const int group_m = min(args.tiles_max - first_m, hmx::kGroupM);
  const int in_group = blockIdx.x % per_group;
  const int t = first_m + in_group % group_m;
  const int n0 = (in_group / group_m) * kBlockN;
  if (t >= *args.tile_count) return;  // every thread of the CTA: nothing below has started
  const GroupTile tile = args.tiles[t];

  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024u - (hmx::SmemAddr(smem_raw) & 1023u)) & 1023u);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + Smem::kBars);
  uint64_t* empty = full + kStages;

  const int warpgroup = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    hmx::PrefetchTensorMap(&map_a);
    hmx::PrefetchTensorMap(&map_b);
    hmx::PrefetchTensorMap(&map_sa);
    for (int s = 0; s < kStages; ++s) {
      hmx::MbarInit(&full[s], 1);                 // the producer's arrive.expect_tx
      hmx::MbarInit(&empty[s], 4 * kConsumers);  // one arrival per consumer warp
    }
    hmx::FenceBarrierInit();
  }
  __syncthreads();

  if (warpgroup == 0) {
    // ---------------------------------------------------------------- producer
    if (threadIdx.x == 0) {
      const int b_row = tile.group * args.n + n0;  // rhs viewed as (G * N, K)
      for (int kt = 0; kt < args.k_tiles; ++kt) {
        const int s = kt % kStages;
        hmx::MbarWait(&empty[s], ((kt / kStages) & 1) ^ 1);
        hmx::MbarArriveExpectTx(&full[s], Smem::kStageTx);
        hmx::TmaLoad3d(smem + Smem::kA + s * Smem::kABytes, &map_a, &full[s], kt * kBlockK, tile.row0, 0);
        hmx::TmaLoad3d(smem + Smem::kB + s * Smem::kBBytes, &map_b, &full[s], kt * kBlockK, b_row, 0);
        hmx::TmaLoad3d(smem + Smem::kSa + s * Smem::kSaBytes, &map_sa, &full[s], tile.row0, kt, 0);
      }
    }
    return;  // no CTA-wide barrier follows
  }

  // ------------------------------------------------------------------ consumers
  const int wg = warpgroup - 1;
  const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
  // wgmma D fragment (ISA 9.7.15.5.1): register 4*j + 2*h + c holds row 16*warp + lane/4 + 8*h,
  // column 8*j + 2*(lane%4) + c of this warpgroup's 64 rows.
  const int row0 = wg * 64 + warp * 16 + lane / 4;
  const int quad = lane % 4;
  const float* sb_tile = args.rhs_scale + (static_cast<int64_t>(tile.group) * args.n_blocks + n0 / kBlockN) *
                                             args.k_tiles;

  float acc[kAccRegs];
  float part[kAccRegs];
#pragma unroll
  for (int i = 0; i < kAccRegs; ++i) acc[i] = part[i] = 0.f;

  for (int kt = 0; kt < args.k_tiles; ++kt) {
    const int s = kt % kStages;
    const float sb = __ldg(sb_tile + kt);  // issued before the wait, which hides its latency
    hmx::MbarWait(&full[s], (kt / kStages) & 1);
    const uint8_t* a_tile = smem + Smem::kA + s * Smem::kABytes + wg * 64 * kBlockK;
    const uint8_t* b_tile = smem + Smem::kB + s * Smem::kBBytes;
    hmx::WgmmaFence();
#pragma unroll
    for (int i = 0; i < kAccRegs; ++i) hmx::FenceRegister(part[i]);
#pragma unroll
    for (int j = 0; j < kBlockK / 32; ++j) {  // scale_d = j: the first k32 step overwrites part
      hmx::Wgmma<kBlockN, hmx::Fp8::kE4M3, hmx::Fp8::kE4M3>::Run(part, hmx::DescKMajorSw128(a_tile + j * 32),
                                                               hmx::DescKMajorSw128(b_tile + j * 32), j);
    }
    hmx::WgmmaCommit();
    hmx::WgmmaWait<0>();
#pragma unroll
    for (int i = 0; i < kAccRegs; ++i) hmx::FenceRegister(part[i]);
    const float* sa = reinterpret_cast<const float*>(smem + Smem::kSa + s * Smem::kSaBytes);
    const float s0 = sa[row0] * sb, s1 = sa[row0 + 8] * sb;
#pragma unroll
    for (int c8 = 0; c8 < kBlockN / 8; ++c8) {
      acc[4 * c8 + 0] = fmaf(part[4 * c8 + 0], s0, acc[4 * c8 + 0]);
      acc[4 * c8 + 1] = fmaf(part[4 * c8 + 1], s0, acc[4 * c8 + 1]);
      acc[4 * c8 + 2] = fmaf(part[4 * c8 + 2], s1, acc[4 * c8 + 2]);
      acc[4 * c8 + 3] = fmaf(part[4 * c8 + 3], s1, acc[4 * c8 + 3]);
    }
    // This warp's wgmma reads of the stage completed (wait_group 0) and its scale reads are done
    // once every lane got here: one arrival per warp frees the stage for the producer.
    __syncwarp();
    if (lane == 0) hmx::MbarArrive(&empty[s]);
  }

  // ------------------------------------------------------------------ epilogue
  // StorePair stores rows < its `m` and columns < n: `m` = the group's end row, so rows of the
  // next group (or past M) in this tile are left alone. N is even: pairs are aligned.
  hmx::KernelArgs store{args.out, tile.row_end, args.n, 0, args.out_type, 0};
#pragma unroll
  for (int c8 = 0; c8 < kBlockN / 8; ++c8) {
    const int col = n0 + 8 * c8 + 2 * quad;
    hmx::StorePair(store, 0, tile.row0 + row0, col, acc[4 * c8 + 0], acc[4 * c8 + 1], true);
    hmx::StorePair(store, 0, tile.row0 + row0 + 8, col, acc[4 * c8 + 2], acc[4 * c8 + 3], true);
  }
#endif  // sm_90a
}

}  // namespace gpuext::hopper_grouped
