// The 16-byte vector kernels of quantize / dequantize (docs/design.md, "Quantize at memory speed on
// Hopper"): included by block_scaled_cuda.cu only (nvcc), which keeps the generic kernels for the
// layouts these do not take (rows not a multiple of 16 elements, misaligned buffers).
//
// A thread owns 16 elements along the last axis (32 for packed FP4): its loads are 16-byte loads
// and its codes one 16-byte store. Block scales come from ComputeBlockScale (block_scaled_math.h,
// the scalar rule) once per block; elements take block_scaled_fast.h's paths (host-checked against
// the scalar rules), blocks those do not cover take QuantizeElement.
//
// The element loads and stores of the row (rows of whole blocks), tile, per-tensor and dequantize
// kernels are warp-contiguous: the 32 lanes of one instruction cover 32 x its width contiguous bytes,
// so no instruction reads or writes part of a sector that the next one completes (round 2,
// docs/design.md). Where a thread needs more contiguous bytes than one instruction moves, the warp
// stages them through shared memory (LoadVecWarp) or a thread owns 16-byte pieces outright
// (FP8_TENSOR, dequantize), or a lane owns one 16-byte piece of each of its rows (column / fused
// kernels, FP8_128x128 tiles). Still thread-contiguous: padded rows.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "csrc/formats/block_scaled.h"
#include "csrc/formats/block_scaled_fast.h"
#include "csrc/formats/block_scaled_io.h"
#include "csrc/formats/cols_layout.h"

namespace gpuext::formats::vec {

using fast::ElemParams;

constexpr int kThreads = 256;
enum InKind : int { kInF32 = 0, kInBf16 = 1, kInF16 = 2 };

GPUEXT_HD constexpr int InBytes(int in) { return in == kInF32 ? 4 : 2; }
GPUEXT_HD constexpr int BlockLen(int32_t f) {
  return f == kNvfp4 ? 16 : (f == kFp8Blockwise1x128 || f == kFp8Blockwise128x128 ? 128 : 32);
}
// Elements per thread along the last axis: one 16-byte store of codes.
GPUEXT_HD constexpr int VecLen(int32_t f, bool packed) { return fast::kFp4(f) && packed ? 32 : 16; }

// n / d for n < 2^32 by a multiply (Granlund-Montgomery; d < 2^31, computed once on the host):
// a 64-bit division is ~70 instructions on the GPU, this is 4.
struct FastDiv {
  uint32_t d = 1, m = 0, s = 0;
  FastDiv() = default;
  explicit FastDiv(uint32_t div) : d(div) {
    while ((1ull << s) < d) ++s;
    m = uint32_t(((1ull << 32) * ((1ull << s) - d)) / d + 1);
  }
  __device__ __forceinline__ uint32_t operator()(uint32_t n) const {
    return uint32_t((uint64_t(__umulhi(n, m)) + n) >> s);
  }
};

// ElemParams as kept in shared memory (12 bytes): p0 (MX: 2^-k; FP8: s, which the scalar path decodes
// again), p1 (FP8: RN(1/s)), and code | special << 8 | fast << 9 (k and m are not needed past ParamsOf).
struct SmemParams {
  float p0, p1;
  uint32_t meta;
};
__device__ __forceinline__ SmemParams ToSmem(const ElemParams& p) {
  return {p.p0, p.p1, p.code | (p.special ? 0x100u : 0u) | (p.fast ? 0x200u : 0u)};
}
__device__ __forceinline__ ElemParams FromSmem(const SmemParams& q) {
  ElemParams p;
  p.p0 = q.p0;
  p.p1 = q.p1;
  p.code = q.meta & 0xFFu;
  p.special = (q.meta & 0x100u) != 0;
  p.fast = (q.meta & 0x200u) != 0;
  return p;
}

// V elements of input kind kIn as 32-bit words: f32 one per word, 16-bit two per word (element 2i low).
template <int kIn, int V>
struct Vec {
  static constexpr int kWords = V * InBytes(kIn) / 4;
  uint32_t w[kWords];
};

template <int kIn, int V>
__device__ __forceinline__ void LoadVec(const void* base, int64_t elem, Vec<kIn, V>& r) {
  const uint4* p = reinterpret_cast<const uint4*>(static_cast<const char*>(base) + elem * InBytes(kIn));
#pragma unroll
  for (int j = 0; j < Vec<kIn, V>::kWords / 4; ++j) {
    const uint4 q = p[j];
    r.w[4 * j] = q.x, r.w[4 * j + 1] = q.y, r.w[4 * j + 2] = q.z, r.w[4 * j + 3] = q.w;
  }
}

// The 16-byte pieces of one thread's V elements.
template <int kIn, int V>
constexpr int kPieces = Vec<kIn, V>::kWords / 4;

// Loads the V elements of each of a warp's 32 consecutive chunks (lane l's chunk: elements
// [first + l V, first + l V + V)) with warp-contiguous 16-byte loads, all issued before any is used,
// and hands each lane its own chunk through `stage` (this warp's 32 x kPieces slots of shared memory;
// fast::StageSlot). `valid`: how many of the 32 chunks exist (1..32); the others read as zeros. Every
// lane of the warp must call it (two __syncwarp; the first keeps the previous call's reads of `stage`
// ahead of this call's writes).
template <int kIn, int V>
__device__ __forceinline__ void LoadVecWarp(const void* base, int64_t first, int valid, uint4* stage, int lane,
                                            Vec<kIn, V>& r) {
  constexpr int W = kPieces<kIn, V>;
  const uint4* p = reinterpret_cast<const uint4*>(static_cast<const char*>(base) + first * InBytes(kIn));
  uint4 q[W];
#pragma unroll
  for (int j = 0; j < W; ++j) q[j] = 32 * j + lane < valid * W ? p[32 * j + lane] : make_uint4(0, 0, 0, 0);
  __syncwarp();
#pragma unroll
  for (int j = 0; j < W; ++j) stage[fast::StageSlot<W>(32 * j + lane)] = q[j];
  __syncwarp();
#pragma unroll
  for (int i = 0; i < W; ++i) {
    const uint4 s = stage[fast::StageSlot<W>(lane * W + i)];
    r.w[4 * i] = s.x, r.w[4 * i + 1] = s.y, r.w[4 * i + 2] = s.z, r.w[4 * i + 3] = s.w;
  }
}

template <int kIn, int V>
__device__ __forceinline__ void ZeroVec(Vec<kIn, V>& r) {
#pragma unroll
  for (int j = 0; j < Vec<kIn, V>::kWords; ++j) r.w[j] = 0;
}

// fp32 bits of element j (exact for every input kind, subnormals included).
template <int kIn, int V>
__device__ __forceinline__ uint32_t ElemBits(const Vec<kIn, V>& r, int j) {
  if constexpr (kIn == kInF32) {
    return r.w[j];
  } else {
    const uint32_t h = (j & 1) ? r.w[j / 2] >> 16 : r.w[j / 2] & 0xFFFFu;
    if constexpr (kIn == kInBf16) return h << 16;
    return __float_as_uint(__half2float(__ushort_as_half(static_cast<unsigned short>(h))));
  }
}

// A 16-bit input's largest |x| bits -> fp32 bits (monotone: NaN above Inf above finite, as the rules need).
template <int kIn>
__device__ __forceinline__ uint32_t WidenAbs16(uint32_t h) {
  return kIn == kInBf16 ? h << 16 : HalfToF32Bits(h);
}

// The largest |x| bits (as fp32 bits) of elements [first, first + n) of r; 16-bit inputs on pairs.
template <int kIn, int V>
__device__ __forceinline__ uint32_t AmaxOf(const Vec<kIn, V>& r, int first, int n) {
  uint32_t m = 0;
  if constexpr (kIn == kInF32) {
#pragma unroll
    for (int j = 0; j < V; ++j)
      if (j >= first && j < first + n) m = max(m, r.w[j] & kF32AbsMask);
    return m;
  } else {
#pragma unroll
    for (int j = 0; j < V / 2; ++j)
      if (2 * j >= first && 2 * j < first + n) m = __vmaxu2(m, r.w[j] & 0x7FFF7FFFu);
    return WidenAbs16<kIn>(max(m & 0xFFFFu, m >> 16));
  }
}

// Per-column |x| maxima of one row, folded into acc (16-bit inputs: pairs of columns per word).
template <int kIn, int V>
__device__ __forceinline__ void ColumnMax(const Vec<kIn, V>& r, uint32_t (&acc)[Vec<kIn, V>::kWords]) {
#pragma unroll
  for (int j = 0; j < Vec<kIn, V>::kWords; ++j)
    acc[j] = kIn == kInF32 ? max(acc[j], r.w[j] & kF32AbsMask) : __vmaxu2(acc[j], r.w[j] & 0x7FFF7FFFu);
}

template <int kIn, int V>
__device__ __forceinline__ uint32_t ColumnAmax(const uint32_t (&acc)[Vec<kIn, V>::kWords], int c) {
  if constexpr (kIn == kInF32) return acc[c];
  return WidenAbs16<kIn>((c & 1) ? acc[c / 2] >> 16 : acc[c / 2] & 0xFFFFu);
}

// The column / token-slot kernels: the |x| maxima of a lane's R rows of one piece (V columns), column by
// column, into part[c][piece] (this warp's row of the CTA's partial maxima; one thread a column folds them).
template <int kIn, int V, int R, int kP>
__device__ __forceinline__ void PublishColumnMaxima(const Vec<kIn, V> (&v)[R], uint32_t (&part)[V][kP], int piece) {
  uint32_t acc[Vec<kIn, V>::kWords];
#pragma unroll
  for (int j = 0; j < Vec<kIn, V>::kWords; ++j) acc[j] = 0;
#pragma unroll
  for (int j = 0; j < R; ++j) ColumnMax(v[j], acc);
#pragma unroll
  for (int c = 0; c < V; ++c) part[c][piece] = ColumnAmax<kIn, V>(acc, c);
}

// ------------------------------------------------------------------------ NVFP4 threshold table
// Row c holds the 7 thresholds of E4M3 block-scale code c under global scale g (padded to 8 words):
// fp32 bits for f32 input (fast::Nvfp4Count, one element at a time), packed 16-bit thresholds for
// bf16 / f16 input (fast::Nvfp4PairCodes16, two elements a word).
constexpr int kTableWords = 128 * 8;

template <int32_t kFmt, int kIn>
__device__ __forceinline__ void BuildTable(uint32_t* table, uint32_t g) {
  if constexpr (kFmt == kNvfp4) {
    for (int i = threadIdx.x; i < kTableWords; i += blockDim.x) {
      const int c = i / 8, t = i % 8;
      const uint32_t u = t < 7 && !GlobalScaleInvalid(g) ? fast::Nvfp4TableEntry(uint32_t(c), t, g) : 0u;
      table[i] = kIn == kInF32 ? u : fast::Nvfp4PackedThreshold(u, kIn == kInF16);
    }
    __syncthreads();
  }
}

// The 7 thresholds of a row (no 8th word: one register less where rows are held across a loop).
__device__ __forceinline__ void ReadRow7(const uint32_t* table, uint32_t code, uint32_t (&row)[7]) {
  const uint4 lo = reinterpret_cast<const uint4*>(table + 8 * code)[0];
  const uint2 mid = reinterpret_cast<const uint2*>(table + 8 * code + 4)[0];
  row[0] = lo.x, row[1] = lo.y, row[2] = lo.z, row[3] = lo.w, row[4] = mid.x, row[5] = mid.y;
  row[6] = table[8 * code + 6];
}

// The codes of a word of two 16-bit elements (NVFP4; `w`: their packed thresholds, `keep`: which
// elements' blocks are not special, 0xF per half), stored as they are stored: one byte of two
// nibbles (packed) or two bytes (element 0 low).
template <bool kNibbles>
__device__ __forceinline__ uint32_t Nvfp4WordCodes(uint32_t x2, const uint32_t* w, uint32_t keep) {
  const uint32_t c = fast::Nvfp4PairCodes16(x2, w) & keep;  // element 0 in bits 0-3, element 1 in 16-19
  return kNibbles ? (c | (c >> 12)) & 0xFFu : (c | (c >> 8)) & 0xFFFFu;
}

__device__ __forceinline__ void ReadRow(const uint32_t* table, uint32_t code, uint32_t (&row)[8]) {
  const uint4* t = reinterpret_cast<const uint4*>(table + 8 * code);
  const uint4 lo = t[0], hi = t[1];
  row[0] = lo.x, row[1] = lo.y, row[2] = lo.z, row[3] = lo.w, row[4] = hi.x, row[5] = hi.y, row[6] = hi.z, row[7] = hi.w;
}

// ------------------------------------------------------------------------ codes of 16 (32) elements
// Element j of a run takes params[j / kPer] (kPer elements per block of the run). Returns the codes
// packed as they are stored: bytes, or nibbles (packed FP4, element 2i in the low nibble).
template <int32_t kFmt, bool kPacked, int kIn, int V, int kPer, int kNp>
__device__ __forceinline__ uint4 CodesOf(const Vec<kIn, V>& v, const ElemParams (&p)[kNp], const uint32_t* table,
                                         uint32_t g) {
  uint32_t out[4] = {0, 0, 0, 0};
  constexpr bool kNibbles = fast::kFp4(kFmt) && kPacked;
  constexpr bool kFp8Elem = !fast::kFp4(kFmt);
  if constexpr (kFmt == kNvfp4 && kIn != kInF32) {
    // two elements (one block: kPer is even) a word against the block's packed thresholds
    static_assert(kPer % 2 == 0 && kNp <= 2, "NVFP4 runs of whole 16-element blocks");
    uint32_t th[kNp][7];
#pragma unroll
    for (int b = 0; b < kNp; ++b) ReadRow7(table, p[b].code, th[b]);
#pragma unroll
    for (int j = 0; j < V; j += 2) {
      const ElemParams& q = p[j / kPer];
      const uint32_t c = Nvfp4WordCodes<kNibbles>(v.w[j / 2], th[j / kPer], q.special ? 0u : 0x000F000Fu);
      out[kNibbles ? j / 8 : j / 4] |= c << (kNibbles ? 4 * (j % 8) : 8 * (j % 4));
    }
  } else {
    bool all_fast = true;
#pragma unroll
    for (int b = 0; b < kNp; ++b) all_fast = all_fast && p[b].fast && !p[b].special;
    if (kFp8Elem && all_fast) {
#pragma unroll
      for (int j = 0; j < V; j += 2) {
        const uint32_t pair = fast::QuantizeFastPair<kFmt>(ElemBits(v, j), ElemBits(v, j + 1), p[j / kPer], p[(j + 1) / kPer]);
        out[j / 4] |= pair << (8 * (j % 4));
      }
    } else {
      // NVFP4 (f32 input here; 16-bit input takes the pairs above): a block's 7 thresholds (its table
      // row, two 16-byte shared loads) in registers once per block when the run has few blocks.
      constexpr int kPre = kFmt == kNvfp4 && kNp <= 2 ? kNp : 0;
      uint32_t th[kPre > 0 ? kPre : 1][8];
#pragma unroll
      for (int b = 0; b < kPre; ++b) ReadRow(table, p[b].code, th[b]);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const ElemParams& q = p[j / kPer];
        uint32_t row[8];
        const uint32_t* u = nullptr;
        if constexpr (kFmt == kNvfp4) {
          if constexpr (kPre > 0) {
            u = th[j / kPer];
          } else {
            ReadRow(table, q.code, row);
            u = row;
          }
        }
        const uint32_t code = all_fast ? fast::QuantizeFastElement<kFmt>(ElemBits(v, j), q, u)
                                       : fast::QuantizeAny<kFmt>(ElemBits(v, j), q, u, g);
        if constexpr (kNibbles) {
          out[j / 8] |= (code & 0xFu) << (4 * (j % 8));
        } else {
          out[j / 4] |= (code & 0xFFu) << (8 * (j % 4));
        }
      }
    }
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

__device__ __forceinline__ void StoreCodes(void* data, int64_t elem, bool nibbles, uint4 c) {
  *reinterpret_cast<uint4*>(static_cast<uint8_t*>(data) + (nibbles ? elem / 2 : elem)) = c;
}

__device__ __forceinline__ uint32_t GlobalOf(const QuantizeArgs& a, int64_t group) {
  return a.geo.format == kNvfp4 && a.global_scale != nullptr ? __float_as_uint(a.global_scale[group]) : kF32One;
}

// ------------------------------------------------------------------------ along the last axis
// [rows, K] with blocks of B along K (1-D formats, inner == 1), K % V == 0. grid.y: the NVFP4 global
// scale groups (rows_per_group rows each; 1 group for other formats). L.ragged: K % B != 0, so each
// row's chunks are padded to whole lane groups (a block's lanes are aligned within the warp).
struct RowsLaunch {
  int64_t k, blocks_along, rows_per_group, chunks_per_row;
  bool ragged;      // K % B != 0: chunks numbered per row, each row padded to whole lane groups
  FastDiv per_row;  // ragged: t / chunks_per_row (the launcher checks t < 2^32)
};

template <int32_t kFmt, int kIn, bool kPacked>
__global__ void __launch_bounds__(kThreads) QuantizeRowsVec(QuantizeArgs a, RowsLaunch L) {
  constexpr int B = BlockLen(kFmt), V = VecLen(kFmt, kPacked);
  constexpr int kLanes = B >= V ? B / V : 1;   // threads per block
  constexpr int kNb = V > B ? V / B : 1;       // blocks per thread
  constexpr int kPer = V / kNb;                // elements of one block in a thread
  constexpr bool kNibbles = fast::kFp4(kFmt) && kPacked;
  __shared__ __align__(16) uint32_t table[kFmt == kNvfp4 ? kTableWords : 1];
  __shared__ uint4 stage[kThreads * kPieces<kIn, V>];  // LoadVecWarp's slots, 32 x pieces per warp
  const int lane = threadIdx.x % 32;
  uint4* const warp_stage = stage + (threadIdx.x / 32) * 32 * kPieces<kIn, V>;
  const int64_t group = blockIdx.y;
  const uint32_t g = GlobalOf(a, group);
  BuildTable<kFmt, kIn>(table, g);
  const int64_t row0 = group * L.rows_per_group;
  const int64_t total = L.rows_per_group * (L.ragged ? L.chunks_per_row : L.k / V);
  const int64_t total_padded = (total + 31) / 32 * 32;  // whole warps iterate alike (shuffles)
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total_padded; t += stride) {
    int64_t elem, scale_index;
    bool active = t < total;
    if (L.ragged) {
      const int64_t r = L.per_row(uint32_t(t)), c = t - r * L.chunks_per_row;
      active = active && c * V < L.k;
      elem = (row0 + r) * L.k + c * V;
      scale_index = (row0 + r) * L.blocks_along + c * V / B;
    } else {
      elem = row0 * L.k + t * V;
      scale_index = row0 * L.blocks_along + t * V / B;  // K % B == 0: blocks run on across rows
    }
    Vec<kIn, V> v;
    if (!L.ragged) {
      // chunks run on across rows, so the warp's 32 chunks are one contiguous span: coalesced
      // loads through shared memory (t - lane < total: total_padded is a multiple of 32)
      const int64_t t0 = t - lane;
      LoadVecWarp(a.x, row0 * L.k + t0 * V, int(min(int64_t(32), total - t0)), warp_stage, lane, v);
    } else if (active) {
      LoadVec(a.x, elem, v);  // padded rows: the warp's chunks are not one span
    } else {
      ZeroVec(v);
    }
    uint32_t amax[kNb];
#pragma unroll
    for (int b = 0; b < kNb; ++b) amax[b] = AmaxOf(v, b * kPer, kPer);
    if constexpr (kLanes > 1) {
#pragma unroll
      for (int off = kLanes / 2; off > 0; off >>= 1) amax[0] = max(amax[0], __shfl_xor_sync(0xFFFFFFFFu, amax[0], off));
    }
    if (!active) continue;
    ElemParams p[kNb];
    uint32_t stored[kNb];
#pragma unroll
    for (int b = 0; b < kNb; ++b) {
      const BlockScale s = ComputeBlockScale(kFmt, a.scale_rounding, amax[b], g);
      stored[b] = s.stored;
      p[b] = fast::ParamsOf<kFmt>(s);
    }
    if (kLanes == 1 || t % kLanes == 0) {
#pragma unroll
      for (int b = 0; b < kNb; ++b) StoreScale(a.scale, kFmt, scale_index + b, stored[b]);
    }
    StoreCodes(a.data, elem, kNibbles, CodesOf<kFmt, kPacked, kIn, V, kPer>(v, p, table, g));
  }
}

// ------------------------------------------------------------------------ along a non-last axis, and both
// x as [outer, K, inner] with blocks of B down K (axis -2 and earlier); inner % E == 0 (E: elements of
// a 16-byte piece). A CTA owns one block-row (B rows of one outer index) x W columns; lane l of warp w
// one piece of each of R rows (cols_layout.h), so every load reads 512 contiguous bytes of a row and
// every code store writes 32 lanes' codes contiguously (round 3, docs/design.md). Column maxima go
// through shared memory; one thread per column derives the scale, stores it (consecutive threads,
// consecutive columns) and leaves the element parameters in shared memory. kBoth (quantize_both_axes,
// inner == N the last axis): a row block along N is B / E consecutive lanes, reduced by shuffles, and a
// second set of codes and scales is written from the same registers.
struct ColsLaunch {
  int64_t k, inner, blocks_along, rows_per_global, row_blocks_along;  // row_blocks_along: ceil(N / B) (kBoth)
};

template <int32_t kFmt, int kIn, bool kBoth>
using ColsShape = cols::Shape<BlockLen(kFmt), InBytes(kIn), kBoth>;

// The codes of R rows x V columns where column c has its own block (parameters cp[c * kStride]):
// column pairs outer, rows inner, so only two columns' parameters (NVFP4: threshold rows) are live.
template <int32_t kFmt, bool kPacked, int kIn, int V, int R, int kStride>
__device__ __forceinline__ void ColumnCodes(const Vec<kIn, V> (&v)[R], const SmemParams* cp, const uint32_t* table,
                                            uint32_t g, uint32_t (&out)[R][2]) {
  constexpr bool kNibbles = fast::kFp4(kFmt) && kPacked;
  static_assert(V <= 8, "at most 8 codes (two words) per row");
#pragma unroll
  for (int j = 0; j < R; ++j) out[j][0] = out[j][1] = 0;
  if constexpr (kFmt == kNvfp4 && kIn != kInF32) {
    // a word holds columns c and c + 1 of a row: their own blocks' thresholds, one in each half
#pragma unroll
    for (int c = 0; c < V; c += 2) {
      const ElemParams p0 = FromSmem(cp[c * kStride]), p1 = FromSmem(cp[(c + 1) * kStride]);
      uint32_t u0[7], u1[7], w[7];
      ReadRow7(table, p0.code, u0);
      ReadRow7(table, p1.code, u1);
#pragma unroll
      for (int i = 0; i < 7; ++i) w[i] = (u0[i] & 0xFFFFu) | (u1[i] & 0xFFFF0000u);
      const uint32_t keep = (p0.special ? 0u : 0xFu) | (p1.special ? 0u : 0xF0000u);
#pragma unroll
      for (int j = 0; j < R; ++j)
        out[j][kNibbles ? c / 8 : c / 4] |= Nvfp4WordCodes<kNibbles>(v[j].w[c / 2], w, keep)
                                           << (kNibbles ? 4 * (c % 8) : 8 * (c % 4));
    }
  } else {
#pragma unroll
    for (int c = 0; c < V; c += 2) {
      const ElemParams p0 = FromSmem(cp[c * kStride]), p1 = FromSmem(cp[(c + 1) * kStride]);
      uint32_t u0[8], u1[8];
      if constexpr (kFmt == kNvfp4) {
        ReadRow(table, p0.code, u0);
        ReadRow(table, p1.code, u1);
      }
      const bool pair_fast = p0.fast && p1.fast && !p0.special && !p1.special;
#pragma unroll
      for (int j = 0; j < R; ++j) {
        const uint32_t x0 = ElemBits(v[j], c), x1 = ElemBits(v[j], c + 1);
        uint32_t c0, c1;
        if (!fast::kFp4(kFmt) && pair_fast) {
          const uint32_t pair = fast::QuantizeFastPair<kFmt>(x0, x1, p0, p1);
          c0 = pair & 0xFFu;
          c1 = pair >> 8;
        } else {
          c0 = fast::QuantizeAny<kFmt>(x0, p0, u0, g);
          c1 = fast::QuantizeAny<kFmt>(x1, p1, u1, g);
        }
        if constexpr (kNibbles) {
          out[j][c / 8] |= ((c0 & 0xFu) | ((c1 & 0xFu) << 4)) << (4 * (c % 8));
        } else {
          out[j][c / 4] |= ((c0 & 0xFFu) | ((c1 & 0xFFu) << 8)) << (8 * (c % 4));
        }
      }
    }
  }
}

// The codes of one piece (kBytes: 8 or 4 FP8 codes, 4 or 2 bytes of packed FP4) as one store
// (the column, fused, FP8_128x128 tile and FP8_TENSOR kernels).
template <int kBytes>
__device__ __forceinline__ void StorePieceCodes(void* data, int64_t byte, uint32_t w0, uint32_t w1) {
  uint8_t* p = static_cast<uint8_t*>(data) + byte;
  if constexpr (kBytes == 8) {
    *reinterpret_cast<uint2*>(p) = make_uint2(w0, w1);
  } else if constexpr (kBytes == 4) {
    *reinterpret_cast<uint32_t*>(p) = w0;
  } else {
    static_assert(kBytes == 2, "8, 4 or 2 bytes of codes per piece");
    *reinterpret_cast<uint16_t*>(p) = static_cast<uint16_t>(w0);
  }
}

// CTAs an SM must hold (the register cap: 64 Ki / threads / this): a CTA's loads stop at its
// barriers, so the SM needs CTAs in different phases to keep loads in flight (round 3). NVFP4's
// thresholds need more than 64 registers, FP8_1x128's 16 rows (8 fused) a lane more than 80, and the
// fused NVFP4 kernel's two sets of packed-threshold codes more than 80 (4 bytes spilled at 3 CTAs).
template <int32_t kFmt, bool kBoth>
constexpr int kColsMinBlocks =
    BlockLen(kFmt) >= 128 || (kBoth && kFmt == kNvfp4) ? 2 : (kBoth || kFmt == kNvfp4 ? 3 : 4);

// The two CTAs of a cluster (sm_90) that share a 128-row block-row (cols::Shape::kCtas == 2). A
// cluster barrier's arrive releases and its wait acquires this CTA's and the peer's shared memory
// writes; a CTA must not exit while its peer may still read its shared memory, hence the final wait.
// Compiled only for sm_90 and later: the launcher runs those kernels only where the loaded code says
// so (ClusterCodeLoaded in block_scaled_cuda.cu) and quantizes the two axes apart elsewhere.
struct Cluster {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  static __device__ __forceinline__ uint32_t Rank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
  }
  // All threads of both CTAs reach every arrive and wait (.aligned: none inside divergent code).
  static __device__ __forceinline__ void Arrive() {
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
  }
  // Orders nothing (no MEMBAR before it: the scale stores in flight need not drain); enough to say "done
  // reading the peer's shared memory", since every value read was used before it.
  static __device__ __forceinline__ void ArriveRelaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  }
  static __device__ __forceinline__ void Wait() { asm volatile("barrier.cluster.wait.aligned;" ::: "memory"); }
  // The word at `p` (this CTA's shared memory) in CTA `rank`'s shared memory.
  static __device__ __forceinline__ uint32_t LoadPeer(const uint32_t* p, uint32_t rank) {
    const uint32_t local = static_cast<uint32_t>(__cvta_generic_to_shared(p));
    uint32_t remote, v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
    asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(remote) : "memory");
    return v;
  }
#else
  static __device__ __forceinline__ uint32_t Rank() { __trap(); return 0; }
  static __device__ __forceinline__ void Arrive() { __trap(); }
  static __device__ __forceinline__ void ArriveRelaxed() { __trap(); }
  static __device__ __forceinline__ void Wait() { __trap(); }
  static __device__ __forceinline__ uint32_t LoadPeer(const uint32_t*, uint32_t) { __trap(); return 0; }
#endif
};

template <int32_t kFmt, int kIn, bool kPacked, bool kBoth>
__global__ void __launch_bounds__(ColsShape<kFmt, kIn, kBoth>::kThreads, (kColsMinBlocks<kFmt, kBoth>))
    QuantizeColsVec(QuantizeArgs a, QuantizeArgs rq, ColsLaunch L) {
  using S = ColsShape<kFmt, kIn, kBoth>;
  constexpr int B = S::B, E = S::E, R = S::R, T = S::kCtaT, W = S::W, kP = S::kPieces, G = S::G;
  constexpr int kCtas = S::kCtas, kRows = S::kCtaRows;
  constexpr bool kNibbles = fast::kFp4(kFmt) && kPacked;
  constexpr int kCodeBytes = kNibbles ? E / 2 : E;
  __shared__ __align__(16) uint32_t table[kFmt == kNvfp4 ? kTableWords : 1];
  __shared__ uint32_t colpart[T][E][kP];  // [warp along the block][column of the piece][piece]
  __shared__ uint32_t colcta[kCtas > 1 ? W : 1];  // this CTA's column maxima, which its peer reads
  __shared__ SmemParams colparam[E][kP];
  __shared__ uint32_t rowpart[kBoth ? kRows : 1][kBoth ? W / B : 1];
  __shared__ SmemParams rowparam[kBoth ? kRows : 1][kBoth ? W / B : 1];
  const int64_t br = blockIdx.x / kCtas;  // o * blocks_along + b
  const int rank = kCtas > 1 ? int(Cluster::Rank()) : 0;  // == blockIdx.x % kCtas
  const int64_t o = br / L.blocks_along, b = br - o * L.blocks_along;
  const uint32_t g = GlobalOf(a, o / L.rows_per_global);
  BuildTable<kFmt, kIn>(table, g);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rl0 = cols::RowOf<S>(warp), piece = cols::PieceOf<S>(warp, lane), tk = rl0 / R;
  const int64_t col_base = int64_t(blockIdx.y) * W;
  const int64_t col = col_base + int64_t(piece) * E;
  const int64_t row0 = b * B + rank * kRows + rl0;
  const bool col_ok = col < L.inner;
  const int64_t first = (o * L.k + row0) * L.inner + col;  // element (row0, col)
  Vec<kIn, E> v[R];
  if (col_ok && row0 + R <= L.k) {
    // every row inside K: R unpredicated loads, all issued before the first is used
#pragma unroll
    for (int j = 0; j < R; ++j) LoadVec(a.x, first + j * L.inner, v[j]);
  } else {
#pragma unroll
    for (int j = 0; j < R; ++j) {
      if (col_ok && row0 + j < L.k) {
        LoadVec(a.x, first + j * L.inner, v[j]);
      } else {
        ZeroVec(v[j]);
      }
    }
  }
  PublishColumnMaxima(v, colpart[tk], piece);
  if constexpr (kBoth) {
    // row block (piece * E) / B of each row: G consecutive lanes (aligned), every lane takes part
#pragma unroll
    for (int j = 0; j < R; ++j) {
      uint32_t m = AmaxOf(v[j], 0, E);
#pragma unroll
      for (int s = 1; s < G; s <<= 1) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, s));
      if (lane % G == 0) rowpart[rl0 + j][piece * E / B] = m;
    }
  }
  __syncthreads();
  // One thread per column: this CTA's maximum of it (with a peer: published, then the peer's folded in).
  const auto cta_column_max = [&](int c) {
    const int pc = c / E, e = c % E;
    uint32_t m = 0;
#pragma unroll
    for (int t = 0; t < T; ++t) m = max(m, colpart[t][e][pc]);
    return m;
  };
  if constexpr (kCtas > 1) {
    for (int c = threadIdx.x; c < W; c += S::kThreads) colcta[c] = cta_column_max(c);
    Cluster::Arrive();  // this CTA's maxima are out
    Cluster::Wait();    // and the peer's
  }
  for (int c = threadIdx.x; c < W; c += S::kThreads) {
    uint32_t m;
    if constexpr (kCtas > 1) {
      m = max(colcta[c], Cluster::LoadPeer(&colcta[c], uint32_t(rank ^ 1)));
    } else {
      m = cta_column_max(c);
    }
    const BlockScale s = ComputeBlockScale(kFmt, a.scale_rounding, m, g);
    colparam[c % E][c / E] = ToSmem(fast::ParamsOf<kFmt>(s));
    if (rank == 0 && col_base + c < L.inner) StoreScale(a.scale, kFmt, br * L.inner + col_base + c, s.stored);
  }
  if constexpr (kCtas > 1) Cluster::ArriveRelaxed();  // done reading the peer's shared memory (waited on below)
  if constexpr (kBoth) {
    constexpr int kRowBlocks = W / B;
    for (int q = threadIdx.x; q < kRows * kRowBlocks; q += S::kThreads) {
      const int rl = q / kRowBlocks, cb = q % kRowBlocks;
      const BlockScale s = ComputeBlockScale(kFmt, rq.scale_rounding, rowpart[rl][cb], g);
      rowparam[rl][cb] = ToSmem(fast::ParamsOf<kFmt>(s));
      const int64_t row = b * B + rank * kRows + rl, cblock = col_base / B + cb;
      if (row < L.k && cblock * B < L.inner)
        StoreScale(rq.scale, kFmt, (o * L.k + row) * L.row_blocks_along + cblock, s.stored);
    }
  }
  __syncthreads();
  if (col_ok) {
    uint32_t codes[R][2];
    ColumnCodes<kFmt, kPacked, kIn, E, R, kP>(v, &colparam[0][piece], table, g, codes);
#pragma unroll
    for (int j = 0; j < R; ++j) {
      if (row0 + j >= L.k) break;
      const int64_t elem = first + j * L.inner;
      const int64_t byte = kNibbles ? elem / 2 : elem;
      StorePieceCodes<kCodeBytes>(a.data, byte, codes[j][0], codes[j][1]);
      if constexpr (kBoth) {
        const ElemParams rp[1] = {FromSmem(rowparam[rl0 + j][piece * E / B])};
        const uint4 c = CodesOf<kFmt, kPacked, kIn, E, E, 1>(v[j], rp, table, g);
        StorePieceCodes<kCodeBytes>(rq.data, byte, c.x, c.y);
      }
    }
  }
  if constexpr (kCtas > 1) Cluster::Wait();  // the peer has read this CTA's maxima: its shared memory may go
}

// ------------------------------------------------------------------------ FP8 128x128 tiles
// One CTA per tile; a thread owns R = 8 rows x V columns, V one 16-byte piece (8 columns of 16-bit
// input with 256 threads, 4 of f32 with 512), so 128 / V consecutive lanes load a tile row's 256 or
// 512 contiguous bytes in one instruction (round 2: 16 columns a thread put two loads on each row,
// each instruction half of every sector it touched) and store its V codes as one 8- or 4-byte
// warp-contiguous store. cols % 16 == 0.
template <int kIn>
struct TileShape {
  static constexpr int V = 16 / InBytes(kIn), R = 8;
  static constexpr int kThreadsPerTile = 128 * 128 / (V * R);
};

template <int kIn>
__global__ void __launch_bounds__(TileShape<kIn>::kThreadsPerTile) QuantizeTilesVec(QuantizeArgs a, int64_t tiles_k) {
  using S = TileShape<kIn>;
  constexpr int V = S::V, R = S::R, kN = S::kThreadsPerTile;
  const BlockScaledGeometry& geo = a.geo;
  const int64_t bcols = geo.block_cols();
  const int64_t tile = blockIdx.x;
  const int64_t bc = tile % bcols, obr = tile / bcols;
  const int64_t br = obr % tiles_k, o = obr / tiles_k;
  const int tn = threadIdx.x % (128 / V), tk = threadIdx.x / (128 / V);
  const int64_t col = bc * 128 + tn * V, row0 = br * 128 + tk * R;
  const bool col_ok = col < geo.cols;
  Vec<kIn, V> v[R];
#pragma unroll
  for (int j = 0; j < R; ++j) {  // every row's load first: the amax below reads them all
    if (col_ok && row0 + j < geo.k) {
      LoadVec(a.x, (o * geo.k + row0 + j) * geo.cols + col, v[j]);
    } else {
      ZeroVec(v[j]);
    }
  }
  uint32_t m = 0;
  if constexpr (kIn == kInF32) {
#pragma unroll
    for (int j = 0; j < R; ++j) m = max(m, AmaxOf(v[j], 0, V));
  } else {  // |x| of every pair of every row, widened once (f16's widening is not one instruction)
#pragma unroll
    for (int j = 0; j < R; ++j)
#pragma unroll
      for (int w = 0; w < Vec<kIn, V>::kWords; ++w) m = __vmaxu2(m, v[j].w[w] & 0x7FFF7FFFu);
    m = WidenAbs16<kIn>(max(m & 0xFFFFu, m >> 16));
  }
  for (int off = 16; off > 0; off >>= 1) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
  __shared__ uint32_t warp_max[kN / 32];
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
  m = 0;
#pragma unroll
  for (int w = 0; w < kN / 32; ++w) m = max(m, warp_max[w]);
  const BlockScale s = ComputeBlockScale(kFp8Blockwise128x128, a.scale_rounding, m, kF32One);
  if (threadIdx.x == 0) StoreScale(a.scale, kFp8Blockwise128x128, tile, s.stored);
  if (!col_ok) return;
  const ElemParams p[1] = {fast::ParamsOf<kFp8Blockwise128x128>(s)};
#pragma unroll
  for (int j = 0; j < R; ++j) {
    if (row0 + j >= geo.k) break;
    const uint4 c = CodesOf<kFp8Blockwise128x128, false, kIn, V, V>(v[j], p, nullptr, kF32One);
    StorePieceCodes<V>(a.data, (o * geo.k + row0 + j) * geo.cols + col, c.x, c.y);
  }
}

// ------------------------------------------------------------------------ FP8_TENSOR
// grid.y walks the tensors; K % 16 == 0. The amax pass folds |x| into the zeroed slot (atomicMax on
// the bits: non-negative floats order as integers); the quantize pass reads it (the scale is written
// by the finalize kernel after both). Every element has the tensor's scale, so neither pass needs a
// thread to own contiguous elements: lane l of a warp takes 16-byte pieces 32 j + l of the warp's
// span (32 chunks of 16 elements, contiguous), so every load and store is warp-contiguous.
template <int kIn>
__device__ __forceinline__ const uint4* TensorPieces(const QuantizeArgs& a, int64_t o) {
  return reinterpret_cast<const uint4*>(static_cast<const char*>(a.x) + o * a.geo.k * InBytes(kIn));
}

template <int kIn>
__global__ void __launch_bounds__(kThreads) TensorAmaxVec(QuantizeArgs a) {
  constexpr int V = 16, W = kPieces<kIn, V>, E = V / W;  // E: elements per 16-byte piece
  constexpr int kSpans = W < 4 ? 4 / W : 1;              // spans per step: 4 loads (64 bytes) in flight
  const BlockScaledGeometry& geo = a.geo;
  const int lane = threadIdx.x % 32;
  const int64_t chunks = geo.k / V, stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x - lane;  // the warp's first chunk
  for (int64_t o = blockIdx.y; o < geo.outer; o += gridDim.y) {
    const uint4* x = TensorPieces<kIn>(a, o);
    uint32_t m = 0;
    for (int64_t c0 = first; c0 < chunks; c0 += kSpans * stride) {
      uint4 u[kSpans * W];
      if (c0 + (kSpans - 1) * stride + 32 <= chunks) {  // every span whole: unpredicated loads, all in flight
#pragma unroll
        for (int s = 0; s < kSpans; ++s)
#pragma unroll
          for (int j = 0; j < W; ++j) u[s * W + j] = x[(c0 + s * stride) * W + 32 * j + lane];
      } else {
#pragma unroll
        for (int s = 0; s < kSpans; ++s) {
          const int64_t c = c0 + s * stride, n = c < chunks ? min(int64_t(32), chunks - c) * W : 0;
#pragma unroll
          for (int j = 0; j < W; ++j) u[s * W + j] = 32 * j + lane < n ? x[c * W + 32 * j + lane] : make_uint4(0, 0, 0, 0);
        }
      }
#pragma unroll
      for (int j = 0; j < kSpans * W; ++j) {
        Vec<kIn, E> q;
        q.w[0] = u[j].x, q.w[1] = u[j].y, q.w[2] = u[j].z, q.w[3] = u[j].w;
        m = max(m, AmaxOf(q, 0, E));
      }
    }
    for (int off = 16; off > 0; off >>= 1) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
    if (lane == 0 && m != 0) atomicMax(static_cast<unsigned int*>(a.scale) + o, m);
  }
}

template <int kIn>
__global__ void __launch_bounds__(kThreads) QuantizeTensorVec(QuantizeArgs a) {
  constexpr int V = 16, W = kPieces<kIn, V>, E = V / W;
  const BlockScaledGeometry& geo = a.geo;
  const int lane = threadIdx.x % 32;
  const int64_t chunks = geo.k / V, stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x - lane;
  for (int64_t o = blockIdx.y; o < geo.outer; o += gridDim.y) {
    const uint32_t amax = static_cast<const uint32_t*>(a.scale)[o];  // still the amax (finalize runs after)
    const ElemParams p[1] = {fast::ParamsOf<kFp8PerTensor>(ComputeBlockScale(kFp8PerTensor, a.scale_rounding, amax, kF32One))};
    const uint4* x = TensorPieces<kIn>(a, o);
    uint8_t* data = static_cast<uint8_t*>(a.data) + o * geo.k;
    for (int64_t c0 = first; c0 < chunks; c0 += stride) {
      const int64_t n = min(int64_t(32), chunks - c0) * W;
      uint4 q[W];
#pragma unroll
      for (int j = 0; j < W; ++j) q[j] = 32 * j + lane < n ? x[c0 * W + 32 * j + lane] : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int j = 0; j < W; ++j) {
        const int64_t piece = c0 * W + 32 * j + lane;
        if (32 * j + lane >= n) break;
        Vec<kIn, E> v;
        v.w[0] = q[j].x, v.w[1] = q[j].y, v.w[2] = q[j].z, v.w[3] = q[j].w;
        const uint4 c = CodesOf<kFp8PerTensor, false, kIn, E, E>(v, p, nullptr, kF32One);
        StorePieceCodes<E>(data, piece * E, c.x, c.y);
      }
    }
  }
}

// ------------------------------------------------------------------------ dequantize
// A thread owns 16-byte pieces of the output: E = 8 (bf16 / f16) or 4 (f32) elements of one row and
// one block (rows and blocks are multiples of E). Lane l of a warp takes pieces 32 u + l of the
// warp's span of 32 U pieces: every load of codes and every store of outputs is warp-contiguous (the
// first version wrote 32-128 contiguous bytes per thread, each store instruction half of every
// sector it touched), and a lane issues its U pieces' loads (codes, scales) before it converts any.
// Layouts: kDeqRows (1-D blocks along the last axis; FP8_TENSOR, a row per tensor), kDeqTiles
// (FP8_128x128), kDeqCols (1-D blocks down a non-last axis: each element of a piece has its own
// scale, E consecutive entries of the scale array, loaded as one vector).
enum DeqLayout : int { kDeqRows = 0, kDeqTiles = 1, kDeqCols = 2 };

struct DeqLaunch {
  int64_t pieces;        // elements / E (< 2^31)
  int64_t row_len;       // elements per row: K (rows), N (tiles), inner (cols)
  int64_t k;             // rows per outer index: M (tiles), K (cols)
  int64_t blocks_along;  // scale entries of the blocked axis per outer index (1-D); tiles: 128-row tiles
  int64_t tile_cols;     // tiles: ceil(N / 128)
  FastDiv per_row;       // piece -> row: row_len / E pieces per row
  FastDiv per_k;         // tiles, cols: row -> outer index
  FastDiv per_global;    // NVFP4: outer index -> global scale index
};

template <int32_t kFmt, int kOut, bool kPacked, int kLayout>
struct DeqShape {
  static constexpr int E = kOut == kInF32 ? 4 : 8;
  static constexpr bool kNibbles = fast::kFp4(kFmt) && kPacked;
  static constexpr int kCodeBytes = kNibbles ? E / 2 : E;  // 2, 4 or 8
  static constexpr int kScales = kLayout == kDeqCols ? E : 1;
  static constexpr int U = kLayout == kDeqCols ? 2 : 4;  // pieces per lane in flight
};

template <int kBytes>
__device__ __forceinline__ uint2 LoadCodes(const uint8_t* p) {
  if constexpr (kBytes == 8) return *reinterpret_cast<const uint2*>(p);
  if constexpr (kBytes == 4) return make_uint2(*reinterpret_cast<const uint32_t*>(p), 0u);
  return make_uint2(*reinterpret_cast<const unsigned short*>(p), 0u);
}

// kN consecutive stored scales (uint8 codes or fp32 bits) from index i.
template <int32_t kFmt, int kN>
struct ScaleRun {
  static constexpr bool kF32 = fast::kF32Scale(kFmt);
  uint32_t w[kF32 ? kN : (kN + 3) / 4];
  __device__ __forceinline__ void Load(const void* scale, int64_t i) {
    if constexpr (kN == 1) {
      w[0] = LoadScale(scale, kFmt, i);
    } else if constexpr (kF32) {
      const uint4* p = reinterpret_cast<const uint4*>(static_cast<const uint32_t*>(scale) + i);
#pragma unroll
      for (int j = 0; j < kN / 4; ++j) {
        const uint4 q = p[j];
        w[4 * j] = q.x, w[4 * j + 1] = q.y, w[4 * j + 2] = q.z, w[4 * j + 3] = q.w;
      }
    } else if constexpr (kN == 8) {
      const uint2 q = *reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(scale) + i);
      w[0] = q.x, w[1] = q.y;
    } else {
      w[0] = *reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(scale) + i);
    }
  }
  __device__ __forceinline__ void Zero() {
#pragma unroll
    for (int j = 0; j < int(sizeof(w) / 4); ++j) w[j] = 0;
  }
  __device__ __forceinline__ uint32_t Get(int e) const {
    if constexpr (kN == 1 || kF32) return w[kN == 1 ? 0 : e];
    return (w[e / 4] >> (8 * (e % 4))) & 0xFFu;
  }
};

template <int32_t kFmt>
__device__ __forceinline__ float2 CodePairValues(uint32_t pair16) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if constexpr (!fast::kFp4(kFmt) && kFmt != kMxfp8E5m2) {
    unsigned int h2;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(static_cast<unsigned short>(pair16)));
    return __half22float2(*reinterpret_cast<const __half2*>(&h2));
  }
#endif
  if constexpr (kFmt == kMxfp8E5m2) {  // E5M2 is f16 with the low byte dropped
    const unsigned int h2 = ((pair16 & 0xFFu) << 8) | ((pair16 & 0xFF00u) << 16);
    return __half22float2(*reinterpret_cast<const __half2*>(&h2));
  }
  return make_float2(fast::CodeValue<kFmt>(pair16 & 0xFFu), fast::CodeValue<kFmt>(pair16 >> 8));
}

// The E outputs of one piece as the 16 bytes stored: the fast path where every scale of the piece
// passes DequantParams and no code is NaN / Inf, the scalar rule (out of line) otherwise.
template <int32_t kFmt, int kOut, bool kNibbles, int E, int kN>
__device__ __forceinline__ uint4 DequantPiece(uint2 codes, const ScaleRun<kFmt, kN>& s, uint32_t g) {
  float m0[kN], m1[kN];
  bool ok = true;
#pragma unroll
  for (int i = 0; i < kN; ++i) ok = fast::DequantParams<kFmt>(s.Get(i), g, &m0[i], &m1[i]) && ok;
  if constexpr (!kNibbles) {
    ok = ok && !fast::AnySpecialCode4<kFmt>(codes.x) && (E == 4 || !fast::AnySpecialCode4<kFmt>(codes.y));
  }
  uint32_t out[4] = {0, 0, 0, 0};
  if (ok) {
    float f[E];
#pragma unroll
    for (int j = 0; j < E; j += 2) {
      uint32_t pair;
      if constexpr (kNibbles) {
        const uint32_t byte = (codes.x >> (4 * j)) & 0xFFu;
        pair = (byte & 0xFu) | ((byte >> 4) << 8);
      } else {
        pair = ((j < 4 ? codes.x : codes.y) >> (8 * (j % 4))) & 0xFFFFu;
      }
      const float2 v = CodePairValues<kFmt>(pair);
      const int i0 = kN == 1 ? 0 : j, i1 = kN == 1 ? 0 : j + 1;
      f[j] = MulRn(v.x, m0[i0]);
      f[j + 1] = MulRn(v.y, m0[i1]);
      if constexpr (kFmt == kNvfp4) {
        f[j] = MulRn(f[j], m1[i0]);
        f[j + 1] = MulRn(f[j + 1], m1[i1]);
      }
    }
#pragma unroll
    for (int j = 0; j < E; j += 2) {
      if constexpr (kOut == kInF32) {
        out[j] = __float_as_uint(f[j]);
        out[j + 1] = __float_as_uint(f[j + 1]);
      } else if constexpr (kOut == kInBf16) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(f[j], f[j + 1]);
        out[j / 2] = *reinterpret_cast<const uint32_t*>(&h);
      } else {
        const __half2 h = __floats2half2_rn(f[j], f[j + 1]);
        out[j / 2] = *reinterpret_cast<const uint32_t*>(&h);
      }
    }
  } else {
    const BitFormat of = kOut == kInF32 ? F32Format() : (kOut == kInBf16 ? BF16Format() : F16Format());
#pragma unroll
    for (int j = 0; j < E; ++j) {
      const uint32_t code = kNibbles ? (codes.x >> (4 * j)) & 0xFu : ((j < 4 ? codes.x : codes.y) >> (8 * (j % 4))) & 0xFFu;
      const uint32_t bits = fast::DequantizeSlow<kFmt>(code, s.Get(kN == 1 ? 0 : j), g, of);
      if constexpr (kOut == kInF32) {
        out[j] = bits;
      } else {
        out[j / 2] |= bits << (16 * (j % 2));
      }
    }
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

template <int32_t kFmt, int kOut, bool kPacked, int kLayout>
__global__ void __launch_bounds__(kThreads) DequantVec(DequantizeArgs a, DeqLaunch L) {
  using S = DeqShape<kFmt, kOut, kPacked, kLayout>;
  constexpr int E = S::E, U = S::U, kN = S::kScales;
  constexpr int B = kFmt == kFp8PerTensor ? 1 : BlockLen(kFmt);
  const int lane = threadIdx.x % 32;
  const int64_t warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int64_t warps = int64_t(gridDim.x) * blockDim.x / 32;
  const int64_t per_row = L.row_len / E;
  const uint8_t* data = static_cast<const uint8_t*>(a.data);
  for (int64_t span = warp * 32 * U; span < L.pieces; span += warps * 32 * U) {
    uint2 codes[U];
    ScaleRun<kFmt, kN> sc[U];
    uint32_t g[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {  // every load of the U pieces first
      const int64_t p = span + 32 * u + lane;
      codes[u] = make_uint2(0u, 0u);
      sc[u].Zero();
      g[u] = kF32One;
      if (p >= L.pieces) continue;
      const int64_t row = L.per_row(uint32_t(p)), col = (p - row * per_row) * E;
      int64_t si, outer = row;  // the piece's first scale entry, and its outer index
      if constexpr (kLayout == kDeqTiles) {
        outer = L.per_k(uint32_t(row));
        const int64_t r = row - outer * L.k;
        si = (outer * L.blocks_along + r / 128) * L.tile_cols + col / 128;
      } else if constexpr (kLayout == kDeqCols) {
        outer = L.per_k(uint32_t(row));
        const int64_t kk = row - outer * L.k;
        si = (outer * L.blocks_along + kk / B) * L.row_len + col;
      } else if constexpr (kFmt == kFp8PerTensor) {
        si = row;
      } else {
        si = row * L.blocks_along + col / B;
      }
      codes[u] = LoadCodes<S::kCodeBytes>(data + p * S::kCodeBytes);
      sc[u].Load(a.scale, si);
      if constexpr (kFmt == kNvfp4) g[u] = __float_as_uint(a.global_scale[L.per_global(uint32_t(outer))]);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t p = span + 32 * u + lane;
      if (p >= L.pieces) break;
      reinterpret_cast<uint4*>(a.y)[p] = DequantPiece<kFmt, kOut, S::kNibbles, E, kN>(codes[u], sc[u], g[u]);
    }
  }
}

}  // namespace gpuext::formats::vec
