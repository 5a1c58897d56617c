// The hopper_mx kernel: TMA -> shared memory -> FP8 wgmma -> per-block scale promotion -> store.
//
// Roles (one CTA = 1 + kConsumers warpgroups, one output tile of kBlockM x kBlockN):
//   warpgroup 0, thread 0: producer. For each K tile of 128 elements it waits until the stage is
//     free, then issues four TMA loads into it (A tile, B tile, and the 4 fp32 scales per row of
//     A and per row of B that cover those 128 elements) completing on the stage's `full` barrier.
//   warpgroups 1..kConsumers: each owns 64 rows of the tile. Per K tile and per 32-long scale
//     block j it runs one m64nNk32 wgmma into a scratch accumulator `part` (scale-d = 0, so
//     part = A_j B_j^T), waits for it, and folds it into `acc` with the two scales:
//         acc[r][c] += (part[r][c] * sa[j][r]) * sb[j][c]       (FMUL, then FFMA)
//     (exactness of this step and its limits: see the comment at the promotion below; a warp
//     with a scale at either end of E8M0's range takes PromoteExact instead).
//     Then each warp releases the stage on its `empty` barrier.
// While one consumer warpgroup promotes, the other's wgmma keeps the tensor cores busy. The
// promotion is 2 FP32 instructions per accumulator per k32 step; with the scale loads, wgmma
// descriptors and barriers a consumer warp issues ~183 instructions per k32 step (m128n128
// config, counted in the SASS), so issue slots, not tensor cores, bound this design at ~35 % of
// the FP8 peak (benchmarks/notes/hopper_mx.md has the counts and the model).
//
// Edges: rows/columns past M/N and K past the end are zero-filled by TMA (scales too, so those
// blocks add 0); the epilogue stores only in-range elements. Deterministic: fixed K order, no
// split-K, no atomics. An element whose float32 sum is not finite (inf / NaN operands, or terms
// past float32's range: scales near 2^127) is recomputed after the store in a scaled domain
// (promote.h, RescanElement), so inf - inf cannot turn a result the definition rounds to +-inf
// into NaN.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "csrc/hopper_mx/promote.h"  // TakesFastStep, FastStep, PromoteExact, RescanElement
#include "csrc/hopper_mx/ptx.cuh"
#include "csrc/hopper_mx/wgmma_fp8.cuh"

namespace gpuext::hopper_mx {

inline constexpr int kBlockK = 128;                        // one 128-byte swizzle row of FP8
inline constexpr int kScalesPerTile = kBlockK / 32;        // scale blocks per K tile
inline constexpr int kGroupM = 8;                          // rasterisation group (L2 reuse)

template <int kConsumers, int kBlockN, int kStages>
struct SmemLayout {
  static constexpr int kBlockM = 64 * kConsumers;
  static constexpr int kABytes = kBlockM * kBlockK;        // FP8: one byte per element
  static constexpr int kBBytes = kBlockN * kBlockK;
  static constexpr int kSaBytes = kScalesPerTile * kBlockM * 4;
  static constexpr int kSbBytes = kScalesPerTile * kBlockN * 4;
  static constexpr int kStageTx = kABytes + kBBytes + kSaBytes + kSbBytes;
  // A and B first: every tile starts on a 1024-byte boundary (128B swizzle atoms).
  static constexpr int kA = 0;
  static constexpr int kB = kA + kStages * kABytes;
  static constexpr int kSa = kB + kStages * kBBytes;
  static constexpr int kSb = kSa + kStages * kSaBytes;
  static constexpr int kBars = kSb + kStages * kSbBytes;
  static constexpr int kEnd = kBars + 2 * kStages * 8;
  // +1024: the dynamic shared memory window is only 16-byte aligned; we align it up ourselves.
  static constexpr int kBytes = kEnd + 1024;
  static_assert(kABytes % 1024 == 0 && kBBytes % 1024 == 0, "tiles must keep 1024-byte alignment");
  static_assert(kSaBytes % 128 == 0 && kSbBytes % 128 == 0, "TMA destinations need 128-byte alignment");
  static_assert(kBytes <= 227 * 1024, "exceeds the 227 KB of shared memory a Hopper CTA can have");
};

struct KernelArgs {
  void* out;
  int m, n;
  int k_blocks;  // K / 32
  int out_type;  // OutType
  long long out_batch_stride;
};

// The arithmetic of a kernel's rescan (the elements whose float32 sum left the finite range;
// promote.h): where the operands and their scales are in global memory.
struct RescanArgs {
  const uint8_t* a;   // [batch, m, k] FP8
  const uint8_t* b;   // [batch, n, k] FP8
  const float* sa;    // [batch, k/32, m_pad]
  const float* sb;    // [batch, k/32, n_pad]
  long long k;
  long long m_pad, n_pad;
};

__device__ __forceinline__ void StorePair(const KernelArgs& args, long long base, int row, int col,
                                          float v0, float v1, bool vec_ok) {
  // vec_ok: N even, so (row*N + col) is even and the pair is 4/8-byte aligned.
  if (row >= args.m || col >= args.n) return;
  const long long idx = base + static_cast<long long>(row) * args.n + col;
  const bool both = col + 1 < args.n;
  switch (args.out_type) {
    case 0: {
      float* o = static_cast<float*>(args.out) + idx;
      if (both && vec_ok) {
        *reinterpret_cast<float2*>(o) = make_float2(v0, v1);
      } else {
        o[0] = v0;
        if (both) o[1] = v1;
      }
      break;
    }
    case 1: {
      __nv_bfloat16* o = static_cast<__nv_bfloat16*>(args.out) + idx;
      if (both && vec_ok) {
        *reinterpret_cast<__nv_bfloat162*>(o) = __floats2bfloat162_rn(v0, v1);
      } else {
        o[0] = __float2bfloat16_rn(v0);
        if (both) o[1] = __float2bfloat16_rn(v1);
      }
      break;
    }
    default: {
      __half* o = static_cast<__half*>(args.out) + idx;
      if (both && vec_ok) {
        *reinterpret_cast<__half2*>(o) = __floats2half2_rn(v0, v1);
      } else {
        o[0] = __float2half_rn(v0);
        if (both) o[1] = __float2half_rn(v1);
      }
      break;
    }
  }
}

// One element (the rescan's): as StorePair's first, without the pairing.
__device__ __forceinline__ void StoreOne(const KernelArgs& args, long long base, int row, int col, float v) {
  if (row >= args.m || col >= args.n) return;
  const long long idx = base + static_cast<long long>(row) * args.n + col;
  switch (args.out_type) {
    case 0: static_cast<float*>(args.out)[idx] = v; break;
    case 1: static_cast<__nv_bfloat16*>(args.out)[idx] = __float2bfloat16_rn(v); break;
    default: static_cast<__half*>(args.out)[idx] = __float2half_rn(v); break;
  }
}

template <int kConsumers, int kBlockN, int kStages, Fp8 kA, Fp8 kB>
__global__ void __launch_bounds__(128 * (kConsumers + 1), 1)
    HopperMxKernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                   const __grid_constant__ CUtensorMap map_sa, const __grid_constant__ CUtensorMap map_sb,
                   const KernelArgs args, const RescanArgs rescan) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = SmemLayout<kConsumers, kBlockN, kStages>;
  constexpr int kBlockM = L::kBlockM;
  constexpr int kAccRegs = kBlockN / 2;  // m64nN f32 accumulator: N/2 registers per thread

  extern __shared__ uint8_t smem_raw[];
  // Align up by offsetting smem_raw itself, computed from its shared-window address: the compiler
  // then still knows `smem` is shared memory and emits LDS for the scale reads. (Rounding the
  // pointer through uintptr_t made it generic: 64-bit LD.E plus address arithmetic per read.)
  uint8_t* smem = smem_raw + ((1024u - (SmemAddr(smem_raw) & 1023u)) & 1023u);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBars);
  uint64_t* empty = full + kStages;

  // Grouped rasterisation: consecutive CTAs share A rows (kGroupM tiles of M) across N.
  const int tiles_m = (args.m + kBlockM - 1) / kBlockM;
  const int tiles_n = (args.n + kBlockN - 1) / kBlockN;
  const int per_group = kGroupM * tiles_n;
  const int group = blockIdx.x / per_group;
  const int first_m = group * kGroupM;
  const int group_m = min(tiles_m - first_m, kGroupM);
  const int in_group = blockIdx.x % per_group;
  const int m0 = (first_m + in_group % group_m) * kBlockM;
  const int n0 = (in_group / group_m) * kBlockN;
  const int batch = blockIdx.y;
  const int k_tiles = (args.k_blocks + kScalesPerTile - 1) / kScalesPerTile;

  const int warpgroup = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    // The producer's first TMAs need the maps; fetch them while the barriers are set up.
    PrefetchTensorMap(&map_a);
    PrefetchTensorMap(&map_b);
    PrefetchTensorMap(&map_sa);
    PrefetchTensorMap(&map_sb);
    for (int s = 0; s < kStages; ++s) {
      MbarInit(&full[s], 1);                    // the producer's arrive.expect_tx
      MbarInit(&empty[s], 4 * kConsumers);     // one arrival per consumer warp
    }
    FenceBarrierInit();
  }
  __syncthreads();

  if (warpgroup == 0) {
    // ---------------------------------------------------------------- producer
    if (threadIdx.x == 0) {
      for (int kt = 0; kt < k_tiles; ++kt) {
        const int s = kt % kStages;
        MbarWait(&empty[s], ((kt / kStages) & 1) ^ 1);
        MbarArriveExpectTx(&full[s], L::kStageTx);
        TmaLoad3d(smem + L::kA + s * L::kABytes, &map_a, &full[s], kt * kBlockK, m0, batch);
        TmaLoad3d(smem + L::kB + s * L::kBBytes, &map_b, &full[s], kt * kBlockK, n0, batch);
        TmaLoad3d(smem + L::kSa + s * L::kSaBytes, &map_sa, &full[s], m0, kt * kScalesPerTile, batch);
        TmaLoad3d(smem + L::kSb + s * L::kSbBytes, &map_sb, &full[s], n0, kt * kScalesPerTile, batch);
      }
    }
    return;  // no CTA-wide barrier follows, so idle producer threads may leave
  }

  // ------------------------------------------------------------------ consumers
  const int wg = warpgroup - 1;        // which 64 rows of the tile
  const int t = threadIdx.x % 128;
  const int warp = t / 32, lane = t % 32;
  // wgmma D fragment (ISA 9.7.15.5.1, "Matrix fragments for wgmma .m64nNk32"): register
  // 4*j + 2*h + c holds row 16*warp + lane/4 + 8*h, column 8*j + 2*(lane%4) + c.
  const int row0 = wg * 64 + warp * 16 + lane / 4;  // tile-relative; row0 + 8 is the other
  const int quad = lane % 4;

  float acc[kAccRegs];
  float part[kAccRegs];
#pragma unroll
  for (int i = 0; i < kAccRegs; ++i) acc[i] = part[i] = 0.f;

  for (int kt = 0; kt < k_tiles; ++kt) {
    const int s = kt % kStages;
    MbarWait(&full[s], (kt / kStages) & 1);
    const uint8_t* a_tile = smem + L::kA + s * L::kABytes + wg * 64 * kBlockK;
    const uint8_t* b_tile = smem + L::kB + s * L::kBBytes;
    const float* sa = reinterpret_cast<const float*>(smem + L::kSa + s * L::kSaBytes);
    const float* sb = reinterpret_cast<const float*>(smem + L::kSb + s * L::kSbBytes);
    const int blocks_here = min(kScalesPerTile, args.k_blocks - kt * kScalesPerTile);
#pragma unroll
    for (int j = 0; j < kScalesPerTile; ++j) {
      if (j < blocks_here) {  // uniform across the CTA: skips the zero-filled tail of K
        WgmmaFence();
#pragma unroll
        for (int i = 0; i < kAccRegs; ++i) FenceRegister(part[i]);
        Wgmma<kBlockN, kA, kB>::Run(part, DescKMajorSw128(a_tile + j * 32),
                                    DescKMajorSw128(b_tile + j * 32), /*scale_d=*/0);
        WgmmaCommit();
        WgmmaWait<0>();
#pragma unroll
        for (int i = 0; i < kAccRegs; ++i) FenceRegister(part[i]);

        // Scale step, 2 instructions per accumulator: x = part * sa (FMUL), acc = fma(x, sb, acc).
        // The FFMA rounds x * sb + acc once, with no range limit on sb, so the term is added
        // exactly (one rounding, as in a float64 reference rounded to fp32) whenever x is exact,
        // i.e. part * sa is zero or a normal fp32. A nonzero partial of 32 FP8 products has
        // 2^-32 <= |part| < 2^37 (E5M2 x E5M2 extremes), hence for MX (power-of-two scales) the
        // step is exact for every partial and every sb when 2^-94 <= sa <= 2^91 (E8M0 codes
        // 33..218: ScaleInWindow), and for sa == 0 (an exact zero term: rows past M, NVFP4's zero
        // code; TakesFastStep). Outside that, part * sa can overflow to inf or lose bits as an
        // fp32 subnormal although the full term part * sa * sb is representable (e.g. sa = 2^127,
        // sb = 2^-127). So a warp whose 16 rows all pass TakesFastStep (every ordinary quantized
        // operand, and the padding rows of a decode batch) takes the 2-instruction step
        // (FastStep, promote.h: the code the host tests run); any other takes PromoteExact, exact
        // for every pair of E8M0 scales. The vote and the two window tests cost ~8 instructions per
        // k32 step of ~183; ldexp-style exponent arithmetic on every accumulator would cost ~10
        // per accumulator. NVFP4 (E4M3 scales, E2M1 partials) is exact too unless a global scale
        // was folded into the scales (24-bit mantissas): then part * sa rounds once more (<= 2^-24
        // relative), in either path. tests/dot/test_hopper_mx.py checks these bounds on a CPU
        // model of the two instructions, and runs PromoteExact and the rescan themselves
        // (promote.h, built with g++ by tests/native/hopper_mx_promote.cc) against float64.
        const float sa0 = sa[j * kBlockM + row0];
        const float sa1 = sa[j * kBlockM + row0 + 8];
        const float2* sb2 = reinterpret_cast<const float2*>(sb + j * kBlockN) + quad;
        if (__all_sync(0xFFFFFFFFu, TakesFastStep(sa0) && TakesFastStep(sa1))) {
#pragma unroll
          for (int c8 = 0; c8 < kBlockN / 8; ++c8) {
            const float2 b = sb2[c8 * 4];  // columns 8*c8 + 2*quad, +1
            acc[4 * c8 + 0] = FastStep(part[4 * c8 + 0], sa0, b.x, acc[4 * c8 + 0]);
            acc[4 * c8 + 1] = FastStep(part[4 * c8 + 1], sa0, b.y, acc[4 * c8 + 1]);
            acc[4 * c8 + 2] = FastStep(part[4 * c8 + 2], sa1, b.x, acc[4 * c8 + 2]);
            acc[4 * c8 + 3] = FastStep(part[4 * c8 + 3], sa1, b.y, acc[4 * c8 + 3]);
          }
        } else {
#pragma unroll
          for (int c8 = 0; c8 < kBlockN / 8; ++c8) {
            const float2 b = sb2[c8 * 4];
            acc[4 * c8 + 0] = PromoteExact(part[4 * c8 + 0], sa0, b.x, acc[4 * c8 + 0]);
            acc[4 * c8 + 1] = PromoteExact(part[4 * c8 + 1], sa0, b.y, acc[4 * c8 + 1]);
            acc[4 * c8 + 2] = PromoteExact(part[4 * c8 + 2], sa1, b.x, acc[4 * c8 + 2]);
            acc[4 * c8 + 3] = PromoteExact(part[4 * c8 + 3], sa1, b.y, acc[4 * c8 + 3]);
          }
        }
      }
    }
    // This warp's wgmma reads of the stage are complete (wait_group 0) and its scale reads are
    // done once every lane got here; one arrival per warp frees the stage for the producer.
    __syncwarp();
    if (lane == 0) MbarArrive(&empty[s]);
  }

  // ------------------------------------------------------------------ epilogue
  const long long base = static_cast<long long>(batch) * args.out_batch_stride;
  const bool vec_ok = (args.n % 2) == 0;
#pragma unroll
  for (int c8 = 0; c8 < kBlockN / 8; ++c8) {
    const int col = n0 + 8 * c8 + 2 * quad;
    StorePair(args, base, m0 + row0, col, acc[4 * c8 + 0], acc[4 * c8 + 1], vec_ok);
    StorePair(args, base, m0 + row0 + 8, col, acc[4 * c8 + 2], acc[4 * c8 + 3], vec_ok);
  }

  // ------------------------------------------------------------------ rescan (rare)
  // An element whose float32 sum is not finite: an inf / NaN operand or scale, or terms and sums
  // past float32's range, where inf - inf made a NaN of what the definition rounds to +-inf
  // (promote.h, RescanElement). Recomputed from global memory, one element at a time, over the
  // set bits of a mask (acc is never indexed at run time: it stays in registers); ordinary
  // operands cost the mask's ~3 instructions per accumulator, once per tile.
  static_assert(kAccRegs <= 64, "one bit per accumulator");
  unsigned long long bad = 0;
#pragma unroll
  for (int i = 0; i < kAccRegs; ++i) bad |= static_cast<unsigned long long>(!IsFinite(acc[i])) << i;
  while (bad != 0) {
    const int i = __ffsll(static_cast<long long>(bad)) - 1;
    bad &= bad - 1;
    const int row = m0 + row0 + 8 * ((i >> 1) & 1), col = n0 + 8 * (i >> 2) + 2 * quad + (i & 1);
    if (row >= args.m || col >= args.n) continue;
    const long long k = rescan.k;
    const float v = RescanElement(rescan.a + (static_cast<long long>(batch) * args.m + row) * k,
                                  rescan.b + (static_cast<long long>(batch) * args.n + col) * k,
                                  rescan.sa + static_cast<long long>(batch) * args.k_blocks * rescan.m_pad + row,
                                  rescan.m_pad,
                                  rescan.sb + static_cast<long long>(batch) * args.k_blocks * rescan.n_pad + col,
                                  rescan.n_pad, args.k_blocks, kA == Fp8::kE5M2, kB == Fp8::kE5M2);
    StoreOne(args, base, row, col, v);
  }
#endif  // sm_90a
}

}  // namespace gpuext::hopper_mx
