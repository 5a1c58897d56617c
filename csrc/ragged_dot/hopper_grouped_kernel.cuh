// The grouped kernel (docs/design.md, "Grouped FP8 kernel at DeepGEMM's speed"): FP8 1x128
// activations x FP8 128x128 expert weights, persistent and warp-specialised.
//
// One CTA per SM: warpgroup 0 the producer (40 registers; one thread issues TMA), warpgroups 1
// and 2 the consumers (232 registers), 64 rows each of a 128-row x 128-column output tile of ONE
// group. The tile table (grouped_layout.h GroupTiles, written on the stream by a one-block scan of
// the group sizes) says which group and rows a row tile holds; an item is (row tile, column
// block), and CTA b computes items b, b + grid, ... below count x column blocks, `count` read on
// the device. Producer and consumers walk the same items; the stage index and phase of the
// pipeline run on from one item to the next, so the next tile's loads overlap the last one's
// epilogue.
//
// Per 128-wide K tile a consumer issues four m64n128k32 wgmma into a partial accumulator P (the
// first overwrites). P is double-buffered: K tile kt+1 is issued into the other buffer before K
// tile kt is promoted, acc += P * (s_lhs[row] * s_rhs), s_rhs being the one 128x128 weight scale
// the tile's columns share. So the promotion every 128 of K (DeepSeek-V3's fix for the FP8 tensor
// cores' short accumulator: one FFMA per accumulator per K tile) runs while the tensor cores work
// on the next K tile, in each warpgroup, besides the overlap of the two warpgroups.
//
// Rows: a tile's 128 rows start at the group's row0; rows past the group's end (the next group's,
// or TMA's zero fill past M) are computed with this group's weights and never stored, and a
// warpgroup whose 64 rows all lie past it skips its wgmma (it still waits on and releases every
// stage: the barriers count its warps). So groups need no alignment and nothing is copied.
// Columns past N: zero-filled weights or the next expert's rows, not stored. K % 16 == 0: the last
// K tile may be partial, zero-filled by TMA. Where each box starts and which CTA takes which item:
// hopper_grouped_schedule.h (shared with the host and the CPU schedule test); the lhs scale box
// starts up to 3 rows before row0, because TMA traps on an innermost coordinate that is not 16-byte
// aligned.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "csrc/hopper_mx/hopper_mx_kernel.cuh"  // StorePair, PTX and wgmma wrappers
#include "csrc/ragged_dot/grouped_layout.h"
#include "csrc/ragged_dot/hopper_grouped_ptx.cuh"
#include "csrc/ragged_dot/hopper_grouped_schedule.h"

namespace gpuext::hopper_grouped {

namespace hmx = ::gpuext::hopper_mx;

inline constexpr int kConsumers = kTileRows / kWarpgroupRows;
inline constexpr int kThreads = 128 * (kConsumers + 1);
inline constexpr int kStages = 6;
inline constexpr int kProducerRegs = 40;
inline constexpr int kConsumerRegs = 232;
static_assert(128 * kProducerRegs + 128 * kConsumers * kConsumerRegs <= 65536, "the register file holds 64K");

struct Smem {
  static constexpr int kABytes = kTileRows * kBlockK;  // FP8: one byte per element
  static constexpr int kBBytes = kBlockN * kBlockK;
  static constexpr int kSaBoxBytes = kScaleBoxRows * 4;  // one fp32 lhs scale per row per K tile
  static constexpr int kSaBytes = (kSaBoxBytes + 127) / 128 * 128;  // a stage's scales: 128-byte aligned
  static constexpr int kStageTx = kABytes + kBBytes + kSaBoxBytes;
  static constexpr int kA = 0;  // A and B first: every tile on a 1024-byte boundary (swizzle atoms)
  static constexpr int kB = kA + kStages * kABytes;
  static constexpr int kSa = kB + kStages * kBBytes;
  static constexpr int kBars = kSa + kStages * kSaBytes;
  static constexpr int kEnd = kBars + 2 * kStages * 8;
  static constexpr int kBytes = kEnd + 1024;  // the dynamic window is only 16-byte aligned
  static_assert(kABytes % 1024 == 0 && kBBytes % 1024 == 0, "tiles must keep 1024-byte alignment");
  static_assert(kSaBytes % 128 == 0, "TMA destinations need 128-byte alignment");
  static_assert(kStageTx == kStageTxBytes, "expect_tx must count exactly the three boxes of a stage");
  static_assert(kBytes <= 227 * 1024, "exceeds the 227 KB of shared memory a Hopper CTA can have");
};

struct Args {
  void* out;
  int n;
  int k_tiles;   // ceil(K / 128)
  int n_blocks;  // ceil(N / 128): the rhs scales' middle dimension
  int out_type;  // hopper_mx::OutType
  const GroupTile* tiles;
  const int32_t* tile_count;
  const float* rhs_scale;  // (G, n_blocks, k_tiles)
};

// The pipeline position: which stage, and the parity of its current phase.
struct Pipe {
  int stage = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void Advance() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
};

// The four k32 steps of one K tile into `p` (the first overwrites it), as one committed group.
// `lo_a` / `lo_b`: the low words of the descriptors of the stage's A rows and B tile; the high
// word of a K-major 128-byte-swizzle descriptor is the same for all (hmx::DescKMajorSw128: stride
// 1024 bytes, swizzle mode 1). The low word's start address field holds the shared address >> 4,
// and every address here is below 2^18, so stepping 32 bytes along K adds 2 with no carry out of
// the 14-bit field. Kept warp-uniform (DescLow), the arithmetic stays in uniform registers. The
// fence orders this thread's earlier reads of `p` (the promotion) before the wgmma writes it.
inline constexpr uint64_t kDescHigh = (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);

__device__ __forceinline__ uint32_t DescLow(const void* smem) {
  // lane 0's value in every lane: ptxas then knows it is warp-uniform
  return __shfl_sync(0xffffffffu, static_cast<uint32_t>(hmx::DescKMajorSw128(smem)), 0);
}

template <int kAcc>
__device__ __forceinline__ void IssueKTile(float (&p)[kAcc], uint32_t lo_a, uint32_t lo_b) {
  hmx::WgmmaFence();
#pragma unroll
  for (int i = 0; i < kAcc; ++i) hmx::FenceRegister(p[i]);
#pragma unroll
  for (int j = 0; j < kBlockK / 32; ++j) {
    using Mma = hmx::Wgmma<kBlockN, hmx::Fp8::kE4M3, hmx::Fp8::kE4M3>;
    Mma::Run(p, kDescHigh | (lo_a + 2 * j), kDescHigh | (lo_b + 2 * j), j);
  }
  hmx::WgmmaCommit();
}

__global__ void __launch_bounds__(kThreads, 1)
    GroupedFp8Kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                     const __grid_constant__ CUtensorMap map_sa, const Args args) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kAcc = kBlockN / 2;  // m64n128 f32 accumulator: 64 registers per thread

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
  // Written by the tile-table kernel before this one started (same stream).
  const int count = *args.tile_count;
  const int items = count * args.n_blocks;

  if (warpgroup == 0) {
    // ---------------------------------------------------------------- producer
    WarpgroupRegDealloc<kProducerRegs>();
    if (threadIdx.x == 0) {
      Pipe pipe;
      for (int item = blockIdx.x; item < items; item += gridDim.x) {
        const CtaTile cta = CtaTileOf(item, count, args.n);
        const GroupTile tile = args.tiles[cta.t];
        for (int kt = 0; kt < args.k_tiles; ++kt) {
          const TileLoads l = LoadsOf(tile, cta.n0, kt, args.n);
          hmx::MbarWait(&empty[pipe.stage], pipe.phase ^ 1);
          hmx::MbarArriveExpectTx(&full[pipe.stage], Smem::kStageTx);
          hmx::TmaLoad3d(smem + Smem::kA + pipe.stage * Smem::kABytes, &map_a, &full[pipe.stage], l.a.c0, l.a.c1, 0);
          hmx::TmaLoad3d(smem + Smem::kB + pipe.stage * Smem::kBBytes, &map_b, &full[pipe.stage], l.b.c0, l.b.c1, 0);
          hmx::TmaLoad3d(smem + Smem::kSa + pipe.stage * Smem::kSaBytes, &map_sa, &full[pipe.stage], l.sa.c0,
                         l.sa.c1, 0);
          pipe.Advance();
        }
      }
    }
    return;  // no CTA-wide barrier follows
  }

  // ------------------------------------------------------------------ consumers
  WarpgroupRegAlloc<kConsumerRegs>();
  const int wg = warpgroup - 1;
  const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
  // wgmma D fragment (ISA 9.7.15.5.1): register 4*j + 2*h + c holds row 16*warp + lane/4 + 8*h,
  // column 8*j + 2*(lane%4) + c of this warpgroup's 64 rows.
  const int row_in_tile = wg * kWarpgroupRows + warp * 16 + lane / 4;
  const int quad = lane % 4;
  // Stage 0's descriptors of this warpgroup's A rows and of B; a stage's are offsets from them.
  const uint32_t lo_a0 = DescLow(smem + Smem::kA + wg * kWarpgroupRows * kBlockK);
  const uint32_t lo_b0 = DescLow(smem + Smem::kB);
  static_assert(Smem::kABytes % 16 == 0 && Smem::kBBytes % 16 == 0, "descriptor offsets count 16 bytes");
  Pipe pipe;

  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    const CtaTile cta = CtaTileOf(item, count, args.n);
    const GroupTile tile = args.tiles[cta.t];
    if (!WarpgroupActive(tile, wg)) {
      // No row of this warpgroup is in the group: release each stage once it has been filled (the
      // wait keeps this warpgroup's arrivals in the stage's current phase).
      for (int kt = 0; kt < args.k_tiles; ++kt) {
        hmx::MbarWait(&full[pipe.stage], pipe.phase);
        __syncwarp();
        if (lane == 0) hmx::MbarArrive(&empty[pipe.stage]);
        pipe.Advance();
      }
      continue;
    }
    const int scale_row = LoadsOf(tile, cta.n0, 0, args.n).scale_skip + row_in_tile;  // this row in the box
    const float* sb_tile = args.rhs_scale +
                           (static_cast<int64_t>(tile.group) * args.n_blocks + cta.n0 / kBlockN) * args.k_tiles;

    float acc[kAcc];
    float p0[kAcc], p1[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;

    // The K loop, software-pipelined by one K tile: K tile kt + 1 is issued into one buffer, then
    // K tile kt (in the other) is promoted while it runs. Written so that no branch lies between a
    // wgmma and the wait that retires it, and which buffer is which is known at compile time:
    // otherwise ptxas serialises every wgmma of the kernel (C7514 / C7518), or moves accumulators
    // through copies. The loop body always issues; the tail retires the last one or two K tiles.
    // issue() also loads the K tile's weight scale: it is needed only when that K tile is promoted,
    // one K tile later, so the global load's latency is hidden behind a whole K tile of wgmma.
    auto issue = [&](float (&p)[kAcc], int kt) {
      const float sb = __ldg(sb_tile + kt);
      MbarWaitUniform(&full[pipe.stage], pipe.phase);
      IssueKTile(p, lo_a0 + pipe.stage * (Smem::kABytes >> 4), lo_b0 + pipe.stage * (Smem::kBBytes >> 4));
      pipe.Advance();
      return sb;
    };
    // acc += done * (s_lhs * s_rhs) for the K tile held in stage `stage`; then frees the stage.
    auto promote = [&](float (&done)[kAcc], int stage, float sb) {
#pragma unroll
      for (int i = 0; i < kAcc; ++i) hmx::FenceRegister(done[i]);
      const float* sa = reinterpret_cast<const float*>(smem + Smem::kSa + stage * Smem::kSaBytes);
      const float s0 = sa[scale_row] * sb, s1 = sa[scale_row + 8] * sb;
      // This warp's wgmma reads of the stage completed and its scale reads are done once every lane
      // got here: one arrival per warp frees the stage for the producer.
      __syncwarp();
      MbarArriveIf(&empty[stage], lane == 0);
#pragma unroll
      for (int c8 = 0; c8 < kBlockN / 8; ++c8) {
        acc[4 * c8 + 0] = fmaf(done[4 * c8 + 0], s0, acc[4 * c8 + 0]);
        acc[4 * c8 + 1] = fmaf(done[4 * c8 + 1], s0, acc[4 * c8 + 1]);
        acc[4 * c8 + 2] = fmaf(done[4 * c8 + 2], s1, acc[4 * c8 + 2]);
        acc[4 * c8 + 3] = fmaf(done[4 * c8 + 3], s1, acc[4 * c8 + 3]);
      }
    };
    const int k_tiles = args.k_tiles;
    int stage0 = pipe.stage;  // the stage of the K tile in flight in p0
    float sb0 = issue(p0, 0), sb1 = 0.f;
    int kt = 0;
    for (; kt + 2 < k_tiles; kt += 2) {
      const int stage1 = pipe.stage;
      sb1 = issue(p1, kt + 1);
      hmx::WgmmaWait<1>();  // K tile kt (p0) is complete; kt + 1 (p1) runs on
      promote(p0, stage0, sb0);
      stage0 = pipe.stage;
      sb0 = issue(p0, kt + 2);
      hmx::WgmmaWait<1>();
      promote(p1, stage1, sb1);
    }
    if (kt + 1 < k_tiles) {  // two K tiles left: kt in p0, kt + 1 to issue
      const int stage1 = pipe.stage;
      sb1 = issue(p1, kt + 1);
      hmx::WgmmaWait<1>();
      promote(p0, stage0, sb0);
      hmx::WgmmaWait<0>();
      promote(p1, stage1, sb1);
    } else {  // one: kt in p0
      hmx::WgmmaWait<0>();
      promote(p0, stage0, sb0);
    }

    // ---------------------------------------------------------------- epilogue
    // StorePair stores rows < its `m` and columns < n: `m` = the group's end row, so rows of the
    // next group (or past M) in this tile are left alone. N is even: pairs are aligned.
    hmx::KernelArgs store{args.out, tile.row_end, args.n, 0, args.out_type, 0};
#pragma unroll
    for (int c8 = 0; c8 < kBlockN / 8; ++c8) {
      const int col = cta.n0 + 8 * c8 + 2 * quad;
      hmx::StorePair(store, 0, tile.row0 + row_in_tile, col, acc[4 * c8 + 0], acc[4 * c8 + 1], true);
      hmx::StorePair(store, 0, tile.row0 + row_in_tile + 8, col, acc[4 * c8 + 2], acc[4 * c8 + 3], true);
    }
  }
#endif  // sm_90a
}

// ------------------------------------------------------------------------------ the weight gradient
// GroupedWgradKernel (RAGGED_CONTRACT, hopper_grouped_schedule.h "the weight gradient"): the same
// CTA shape, pipeline and double-buffered K loop as the forward, over a group's 128-token blocks.
// Both operands carry 1x128 scales along the tokens, one per row of K and per column of N and
// block: the promotion is acc += (P * s_a[row]) * s_b[col] (hopper_mx's order: a zero partial stays
// zero whatever the scales), two FP32 instructions per accumulator per block. A group without
// tokens stores zeros. Items run group after group; rows past K, columns past N are not stored.
struct WgradSmem {
  static constexpr int kABytes = kTileRows * kBlockK;
  static constexpr int kBBytes = kBlockN * kBlockK;
  static constexpr int kSaBytes = kTileRows * 4;  // 512: 128-byte aligned
  static constexpr int kSbBytes = kBlockN * 4;
  static constexpr int kStageTx = kABytes + kBBytes + kSaBytes + kSbBytes;
  static constexpr int kA = 0;
  static constexpr int kB = kA + kStages * kABytes;
  static constexpr int kSa = kB + kStages * kBBytes;
  static constexpr int kSb = kSa + kStages * kSaBytes;
  static constexpr int kBars = kSb + kStages * kSbBytes;
  static constexpr int kEnd = kBars + 2 * kStages * 8;
  static constexpr int kBytes = kEnd + 1024;
  static_assert(kABytes % 1024 == 0 && kBBytes % 1024 == 0, "tiles must keep 1024-byte alignment");
  static_assert(kSaBytes % 128 == 0 && kSbBytes % 128 == 0, "TMA destinations need 128-byte alignment");
  static_assert(kStageTx == kWgradStageTxBytes, "expect_tx must count exactly the four boxes of a stage");
  static_assert(kBytes <= 227 * 1024, "exceeds the 227 KB of shared memory a Hopper CTA can have");
};

struct WgradArgs {
  void* out;      // (G, K, N)
  int k, n;
  int groups;
  int out_type;   // hopper_mx::OutType
  const int32_t* tile_start;  // (G + 1,): group g's token blocks
};

__global__ void __launch_bounds__(kThreads, 1)
    GroupedWgradKernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                       const __grid_constant__ CUtensorMap map_sa, const __grid_constant__ CUtensorMap map_sb,
                       const WgradArgs args) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kAcc = kBlockN / 2;

  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024u - (hmx::SmemAddr(smem_raw) & 1023u)) & 1023u);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + WgradSmem::kBars);
  uint64_t* empty = full + kStages;

  const int warpgroup = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    hmx::PrefetchTensorMap(&map_a);
    hmx::PrefetchTensorMap(&map_b);
    hmx::PrefetchTensorMap(&map_sa);
    hmx::PrefetchTensorMap(&map_sb);
    for (int s = 0; s < kStages; ++s) {
      hmx::MbarInit(&full[s], 1);
      hmx::MbarInit(&empty[s], 4 * kConsumers);
    }
    hmx::FenceBarrierInit();
  }
  __syncthreads();
  const int items = static_cast<int>(WgradItems(args.groups, args.k, args.n));

  if (warpgroup == 0) {
    // ---------------------------------------------------------------- producer
    WarpgroupRegDealloc<kProducerRegs>();
    if (threadIdx.x == 0) {
      Pipe pipe;
      for (int item = blockIdx.x; item < items; item += gridDim.x) {
        const WgradItem it = WgradItemOf(item, args.k, args.n);
        const int b1 = args.tile_start[it.g + 1];
        for (int b = args.tile_start[it.g]; b < b1; ++b) {
          const WgradLoads l = WgradLoadsOf(it, b);
          uint64_t* bar = &full[pipe.stage];
          hmx::MbarWait(&empty[pipe.stage], pipe.phase ^ 1);
          hmx::MbarArriveExpectTx(bar, WgradSmem::kStageTx);
          hmx::TmaLoad3d(smem + WgradSmem::kA + pipe.stage * WgradSmem::kABytes, &map_a, bar, l.a.c0, l.a.c1, 0);
          hmx::TmaLoad3d(smem + WgradSmem::kB + pipe.stage * WgradSmem::kBBytes, &map_b, bar, l.b.c0, l.b.c1, 0);
          hmx::TmaLoad3d(smem + WgradSmem::kSa + pipe.stage * WgradSmem::kSaBytes, &map_sa, bar, l.sa.c0, l.sa.c1, 0);
          hmx::TmaLoad3d(smem + WgradSmem::kSb + pipe.stage * WgradSmem::kSbBytes, &map_sb, bar, l.sb.c0, l.sb.c1, 0);
          pipe.Advance();
        }
      }
    }
    return;
  }

  // ------------------------------------------------------------------ consumers
  WarpgroupRegAlloc<kConsumerRegs>();
  const int wg = warpgroup - 1;
  const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
  const int row_in_tile = wg * kWarpgroupRows + warp * 16 + lane / 4;
  const int quad = lane % 4;
  const uint32_t lo_a0 = DescLow(smem + WgradSmem::kA + wg * kWarpgroupRows * kBlockK);
  const uint32_t lo_b0 = DescLow(smem + WgradSmem::kB);
  Pipe pipe;

  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    const WgradItem it = WgradItemOf(item, args.k, args.n);
    const int b0 = args.tile_start[it.g], b1 = args.tile_start[it.g + 1];
    if (!WgradWarpgroupActive(it, wg, args.k)) {
      for (int b = b0; b < b1; ++b) {
        MbarWaitUniform(&full[pipe.stage], pipe.phase);
        __syncwarp();
        MbarArriveIf(&empty[pipe.stage], lane == 0);
        pipe.Advance();
      }
      continue;
    }

    float acc[kAcc];
    float p0[kAcc], p1[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;

    auto issue = [&](float (&p)[kAcc]) {
      MbarWaitUniform(&full[pipe.stage], pipe.phase);
      IssueKTile(p, lo_a0 + pipe.stage * (WgradSmem::kABytes >> 4), lo_b0 + pipe.stage * (WgradSmem::kBBytes >> 4));
      pipe.Advance();
    };
    // acc += (done * s_a[row]) * s_b[col] for the block in stage `stage`; then frees the stage.
    auto promote = [&](float (&done)[kAcc], int stage) {
#pragma unroll
      for (int i = 0; i < kAcc; ++i) hmx::FenceRegister(done[i]);
      const float* sa = reinterpret_cast<const float*>(smem + WgradSmem::kSa + stage * WgradSmem::kSaBytes);
      const float2* sb = reinterpret_cast<const float2*>(smem + WgradSmem::kSb + stage * WgradSmem::kSbBytes) + quad;
      const float sa0 = sa[row_in_tile], sa1 = sa[row_in_tile + 8];
#pragma unroll
      for (int c8 = 0; c8 < kBlockN / 8; ++c8) {
        const float2 b = sb[c8 * 4];  // columns 8 c8 + 2 quad, + 1
        acc[4 * c8 + 0] = fmaf(done[4 * c8 + 0] * sa0, b.x, acc[4 * c8 + 0]);
        acc[4 * c8 + 1] = fmaf(done[4 * c8 + 1] * sa0, b.y, acc[4 * c8 + 1]);
        acc[4 * c8 + 2] = fmaf(done[4 * c8 + 2] * sa1, b.x, acc[4 * c8 + 2]);
        acc[4 * c8 + 3] = fmaf(done[4 * c8 + 3] * sa1, b.y, acc[4 * c8 + 3]);
      }
      // Every scale this warp needs was read above (mbarrier.arrive releases them): free the stage.
      __syncwarp();
      MbarArriveIf(&empty[stage], lane == 0);
    };
    // The forward's loop (GroupedFp8Kernel): the body always issues, the tail retires the rest.
    if (b1 > b0) {
      int stage0 = pipe.stage;
      issue(p0);
      int b = b0;
      for (; b + 2 < b1; b += 2) {
        const int stage1 = pipe.stage;
        issue(p1);
        hmx::WgmmaWait<1>();
        promote(p0, stage0);
        stage0 = pipe.stage;
        issue(p0);
        hmx::WgmmaWait<1>();
        promote(p1, stage1);
      }
      if (b + 1 < b1) {
        const int stage1 = pipe.stage;
        issue(p1);
        hmx::WgmmaWait<1>();
        promote(p0, stage0);
        hmx::WgmmaWait<0>();
        promote(p1, stage1);
      } else {
        hmx::WgmmaWait<0>();
        promote(p0, stage0);
      }
    }

    // ---------------------------------------------------------------- epilogue (zeros without tokens)
    hmx::KernelArgs store{args.out, args.k, args.n, 0, args.out_type, 0};
    const long long base = static_cast<long long>(it.g) * args.k * args.n;
#pragma unroll
    for (int c8 = 0; c8 < kBlockN / 8; ++c8) {
      const int col = it.n0 + 8 * c8 + 2 * quad;
      hmx::StorePair(store, base, it.m0 + row_in_tile, col, acc[4 * c8 + 0], acc[4 * c8 + 1], true);
      hmx::StorePair(store, base, it.m0 + row_in_tile + 8, col, acc[4 * c8 + 2], acc[4 * c8 + 3], true);
    }
  }
#endif  // sm_90a
}

}  // namespace gpuext::hopper_grouped
