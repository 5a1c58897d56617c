// The 16-byte vector kernels of quantize / dequantize (docs/design.md, "Quantize at memory speed on
// Hopper"): included by block_scaled_cuda.cu only (nvcc), which keeps the generic kernels for the
// layouts these do not take (rows not a multiple of 16 elements, misaligned buffers).
//
// A thread owns 16 elements along the last axis (32 for packed FP4): its loads are 16-byte loads
// and its codes one 16-byte store. Block scales come from ComputeBlockScale (block_scaled_math.h,
// the scalar rule) once per block; elements take block_scaled_fast.h's paths (host-checked against
// the scalar rules), blocks those do not cover take QuantizeElement.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "csrc/formats/block_scaled.h"
#include "csrc/formats/block_scaled_fast.h"
#include "csrc/formats/block_scaled_io.h"

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

// ------------------------------------------------------------------------ NVFP4 threshold table
// Row c holds the 7 thresholds of E4M3 block-scale code c under global scale g (padded to 8 words).
constexpr int kTableWords = 128 * 8;

template <int32_t kFmt>
__device__ __forceinline__ void BuildTable(uint32_t* table, uint32_t g) {
  if constexpr (kFmt == kNvfp4) {
    for (int i = threadIdx.x; i < kTableWords; i += blockDim.x) {
      const int c = i / 8, t = i % 8;
      table[i] = t < 7 && !GlobalScaleInvalid(g) ? fast::Nvfp4TableEntry(uint32_t(c), t, g) : 0u;
    }
    __syncthreads();
  }
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
    // NVFP4: a block's 7 thresholds (its table row, two 16-byte shared loads) in registers once per
    // block when the run has few blocks; per element otherwise (the column kernel's runs).
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
  const int64_t group = blockIdx.y;
  const uint32_t g = GlobalOf(a, group);
  BuildTable<kFmt>(table, g);
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
    if (active) {
      LoadVec(a.x, elem, v);
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
// x as [outer, K, inner] with blocks of B down K (axis -2 and earlier); inner % V == 0. A CTA owns
// one block-row (B rows of one outer index) x W columns; a thread R rows x V columns, T threads
// stacked along the block. Column maxima go through shared memory, one thread per column derives the
// scale, stores it (consecutive threads, consecutive columns) and leaves the element parameters in
// shared memory. kBoth (quantize_both_axes, inner == N the last axis): each row's blocks along N are
// reduced the same way and a second set of codes and scales is written from the same registers.
struct ColsLaunch {
  int64_t k, inner, blocks_along, rows_per_global, row_blocks_along;  // row_blocks_along: ceil(N / B) (kBoth)
};

template <int32_t kFmt, int kIn, bool kPacked>
struct ColsShape {
  static constexpr int B = BlockLen(kFmt), V = VecLen(kFmt, kPacked);
  // per thread: 32 registers of input (64 for f32 in 128-blocks, so that W is a whole block)
  static constexpr int kElems = kIn == kInF32 && B < 128 ? 32 : 64;
  static constexpr int R = kElems / V < B ? kElems / V : B;
  static constexpr int T = B / R;
  static constexpr int N = V == 32 ? 128 : 256;  // threads per CTA: column partials are N x V words of smem
  static constexpr int W = N / T * V;
  static constexpr int P = V < B ? V : B;  // row-partial granularity (kBoth)
  static_assert(W % B == 0, "a CTA's columns must be whole row blocks");
};

// The codes of R rows x V columns where column c has its own block (params cp[c]): column pairs
// outer, rows inner, so only two columns' parameters (NVFP4: threshold rows) are live at a time.
template <int32_t kFmt, bool kPacked, int kIn, int V, int R>
__device__ __forceinline__ void ColumnCodes(const Vec<kIn, V> (&v)[R], const SmemParams* cp, const uint32_t* table,
                                            uint32_t g, uint32_t (&out)[R][4]) {
  constexpr bool kNibbles = fast::kFp4(kFmt) && kPacked;
#pragma unroll
  for (int j = 0; j < R; ++j) out[j][0] = out[j][1] = out[j][2] = out[j][3] = 0;
#pragma unroll
  for (int c = 0; c < V; c += 2) {
    const ElemParams p0 = FromSmem(cp[c]), p1 = FromSmem(cp[c + 1]);
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

template <int32_t kFmt, int kIn, bool kPacked, bool kBoth>
__global__ void __launch_bounds__(ColsShape<kFmt, kIn, kPacked>::N) QuantizeColsVec(QuantizeArgs a, QuantizeArgs rq, ColsLaunch L) {
  using S = ColsShape<kFmt, kIn, kPacked>;
  constexpr int B = S::B, V = S::V, R = S::R, T = S::T, W = S::W, P = S::P, kN = S::N;
  constexpr bool kNibbles = fast::kFp4(kFmt) && kPacked;
  __shared__ __align__(16) uint32_t table[kFmt == kNvfp4 ? kTableWords : 1];
  __shared__ uint32_t colpart[T][W];
  __shared__ SmemParams colparam[W];
  __shared__ uint32_t rowpart[kBoth ? B : 1][kBoth ? W / P : 1];
  __shared__ SmemParams rowparam[kBoth ? B : 1][kBoth ? W / B : 1];
  const int64_t br = blockIdx.x;  // o * blocks_along + b
  const int64_t o = br / L.blocks_along, b = br - o * L.blocks_along;
  const uint32_t g = GlobalOf(a, o / L.rows_per_global);
  BuildTable<kFmt>(table, g);
  const int tk = threadIdx.x % T, tn = threadIdx.x / T;
  const int64_t col_base = int64_t(blockIdx.y) * W;
  const int64_t col = col_base + tn * V;
  const int64_t row0 = b * B + tk * R;
  const bool col_ok = col < L.inner;
  Vec<kIn, V> v[R];
  uint32_t acc[Vec<kIn, V>::kWords];
#pragma unroll
  for (int j = 0; j < Vec<kIn, V>::kWords; ++j) acc[j] = 0;
#pragma unroll
  for (int j = 0; j < R; ++j) {
    if (col_ok && row0 + j < L.k) {
      LoadVec(a.x, (o * L.k + row0 + j) * L.inner + col, v[j]);
    } else {
      ZeroVec(v[j]);
    }
    ColumnMax(v[j], acc);
  }
#pragma unroll
  for (int c = 0; c < V; ++c) colpart[tk][tn * V + c] = ColumnAmax<kIn, V>(acc, c);
  if constexpr (kBoth) {
#pragma unroll
    for (int j = 0; j < R; ++j)
#pragma unroll
      for (int q = 0; q < V / P; ++q) rowpart[tk * R + j][tn * (V / P) + q] = AmaxOf(v[j], q * P, P);
  }
  __syncthreads();
  for (int c = threadIdx.x; c < W; c += kN) {
    uint32_t m = 0;
#pragma unroll
    for (int t = 0; t < T; ++t) m = max(m, colpart[t][c]);
    const BlockScale s = ComputeBlockScale(kFmt, a.scale_rounding, m, g);
    colparam[c] = ToSmem(fast::ParamsOf<kFmt>(s));
    if (col_base + c < L.inner) StoreScale(a.scale, kFmt, br * L.inner + col_base + c, s.stored);
  }
  if constexpr (kBoth) {
    constexpr int kRowBlocks = W / B;
    for (int q = threadIdx.x; q < B * kRowBlocks; q += kN) {
      const int rl = q / kRowBlocks, cb = q % kRowBlocks;
      uint32_t m = 0;
#pragma unroll
      for (int i = 0; i < B / P; ++i) m = max(m, rowpart[rl][cb * (B / P) + i]);
      const BlockScale s = ComputeBlockScale(kFmt, rq.scale_rounding, m, g);
      rowparam[rl][cb] = ToSmem(fast::ParamsOf<kFmt>(s));
      const int64_t row = b * B + rl, cblock = col_base / B + cb;
      if (row < L.k && cblock * B < L.inner)
        StoreScale(rq.scale, kFmt, (o * L.k + row) * L.row_blocks_along + cblock, s.stored);
    }
  }
  __syncthreads();
  if (!col_ok) return;
  uint32_t codes[R][4];
  ColumnCodes<kFmt, kPacked, kIn, V, R>(v, colparam + tn * V, table, g, codes);
#pragma unroll
  for (int j = 0; j < R; ++j) {
    if (row0 + j >= L.k) break;
    const int64_t elem = (o * L.k + row0 + j) * L.inner + col;
    StoreCodes(a.data, elem, kNibbles, make_uint4(codes[j][0], codes[j][1], codes[j][2], codes[j][3]));
    if constexpr (kBoth) {
      constexpr int kNb = V > B ? V / B : 1;
      ElemParams rp[kNb];
#pragma unroll
      for (int q = 0; q < kNb; ++q) rp[q] = FromSmem(rowparam[tk * R + j][(tn * V) / B + q]);
      StoreCodes(rq.data, elem, kNibbles, CodesOf<kFmt, kPacked, kIn, V, V / kNb>(v[j], rp, table, g));
    }
  }
}

// ------------------------------------------------------------------------ FP8 128x128 tiles
// One CTA per tile; a thread owns R rows x 16 columns (R = 4 for 16-bit input, 2 for f32 with 512
// threads), cols % 16 == 0.
template <int kIn>
struct TileShape {
  static constexpr int V = 16, R = kIn == kInF32 ? 2 : 4;
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
  const int tn = threadIdx.x % 8, tk = threadIdx.x / 8;
  const int64_t col = bc * 128 + tn * V, row0 = br * 128 + tk * R;
  const bool col_ok = col < geo.cols;
  Vec<kIn, V> v[R];
  uint32_t m = 0;
#pragma unroll
  for (int j = 0; j < R; ++j) {
    if (col_ok && row0 + j < geo.k) {
      LoadVec(a.x, (o * geo.k + row0 + j) * geo.cols + col, v[j]);
    } else {
      ZeroVec(v[j]);
    }
    m = max(m, AmaxOf(v[j], 0, V));
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
    StoreCodes(a.data, (o * geo.k + row0 + j) * geo.cols + col, false,
               CodesOf<kFp8Blockwise128x128, false, kIn, V, V>(v[j], p, nullptr, kF32One));
  }
}

// ------------------------------------------------------------------------ FP8_TENSOR
// grid.y walks the tensors; K % 16 == 0. The amax pass folds |x| into the zeroed slot (atomicMax on
// the bits: non-negative floats order as integers); the quantize pass reads it (the scale is written
// by the finalize kernel after both).
template <int kIn>
__global__ void __launch_bounds__(kThreads) TensorAmaxVec(QuantizeArgs a) {
  constexpr int V = 16;
  const BlockScaledGeometry& geo = a.geo;
  const int64_t chunks = geo.k / V, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t o = blockIdx.y; o < geo.outer; o += gridDim.y) {
    uint32_t m = 0;
    int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    for (; c + stride < chunks; c += 2 * stride) {  // two chunks in flight per thread
      Vec<kIn, V> v0, v1;
      LoadVec(a.x, o * geo.k + c * V, v0);
      LoadVec(a.x, o * geo.k + (c + stride) * V, v1);
      m = max(m, max(AmaxOf(v0, 0, V), AmaxOf(v1, 0, V)));
    }
    if (c < chunks) {
      Vec<kIn, V> v0;
      LoadVec(a.x, o * geo.k + c * V, v0);
      m = max(m, AmaxOf(v0, 0, V));
    }
    for (int off = 16; off > 0; off >>= 1) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
    if (threadIdx.x % 32 == 0 && m != 0) atomicMax(static_cast<unsigned int*>(a.scale) + o, m);
  }
}

template <int kIn>
__global__ void __launch_bounds__(kThreads) QuantizeTensorVec(QuantizeArgs a) {
  constexpr int V = 16;
  const BlockScaledGeometry& geo = a.geo;
  const int64_t chunks = geo.k / V, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t o = blockIdx.y; o < geo.outer; o += gridDim.y) {
    const uint32_t amax = static_cast<const uint32_t*>(a.scale)[o];  // still the amax (finalize runs after)
    const ElemParams p[1] = {fast::ParamsOf<kFp8PerTensor>(ComputeBlockScale(kFp8PerTensor, a.scale_rounding, amax, kF32One))};
    for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks; c += stride) {
      Vec<kIn, V> v;
      LoadVec(a.x, o * geo.k + c * V, v);
      StoreCodes(a.data, o * geo.k + c * V, false, CodesOf<kFp8PerTensor, false, kIn, V, V>(v, p, nullptr, kF32One));
    }
  }
}

// ------------------------------------------------------------------------ dequantize
// Rows of `row_len` elements (row_len % V == 0) whose scale index is a function of (row, column):
// 1-D formats along the last axis (inner == 1), FP8_128x128 (rows of N), FP8_TENSOR (a row per
// tensor). A thread owns V codes of one row: one 16-byte load, 16-byte stores of the output. Chunks
// are numbered flat (chunk t is elements [tV, tV + V)); the row is t / chunks-per-row by FastDiv.
struct DeqLaunch {
  int64_t chunks, cpr, blocks_along;  // blocks_along: scale entries per row (1-D); tile rows per matrix (128x128)
  int64_t m_rows, tile_cols;          // 128x128: M, ceil(N / 128)
  FastDiv per_row, per_matrix, per_global;
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

template <int kOut>
__device__ __forceinline__ void StoreOut(void* y, int64_t elem, const float (&f)[16]) {
  if constexpr (kOut == kInF32) {
    uint4* p = reinterpret_cast<uint4*>(static_cast<float*>(y) + elem);
#pragma unroll
    for (int j = 0; j < 4; ++j)
      p[j] = make_uint4(__float_as_uint(f[4 * j]), __float_as_uint(f[4 * j + 1]), __float_as_uint(f[4 * j + 2]),
                        __float_as_uint(f[4 * j + 3]));
  } else {
    uint32_t w[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if constexpr (kOut == kInBf16) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(f[2 * j], f[2 * j + 1]);
        w[j] = *reinterpret_cast<const uint32_t*>(&h);
      } else {
        const __half2 h = __floats2half2_rn(f[2 * j], f[2 * j + 1]);
        w[j] = *reinterpret_cast<const uint32_t*>(&h);
      }
    }
    uint4* p = reinterpret_cast<uint4*>(static_cast<uint16_t*>(y) + elem);
    p[0] = make_uint4(w[0], w[1], w[2], w[3]);
    p[1] = make_uint4(w[4], w[5], w[6], w[7]);
  }
}

template <int kOut>
__device__ __forceinline__ void StoreOutBits(void* y, int64_t elem, const uint32_t (&bits)[16]) {
  if constexpr (kOut == kInF32) {
    uint4* p = reinterpret_cast<uint4*>(static_cast<uint32_t*>(y) + elem);
#pragma unroll
    for (int j = 0; j < 4; ++j) p[j] = make_uint4(bits[4 * j], bits[4 * j + 1], bits[4 * j + 2], bits[4 * j + 3]);
  } else {
    uint4* p = reinterpret_cast<uint4*>(static_cast<uint16_t*>(y) + elem);
    p[0] = make_uint4(bits[0] | bits[1] << 16, bits[2] | bits[3] << 16, bits[4] | bits[5] << 16, bits[6] | bits[7] << 16);
    p[1] = make_uint4(bits[8] | bits[9] << 16, bits[10] | bits[11] << 16, bits[12] | bits[13] << 16,
                      bits[14] | bits[15] << 16);
  }
}

template <int32_t kFmt, int kOut, bool kPacked>
__global__ void __launch_bounds__(kThreads) DequantRowsVec(DequantizeArgs a, DeqLaunch L) {
  constexpr int V = VecLen(kFmt, kPacked);
  constexpr int B = kFmt == kFp8PerTensor ? (1 << 30) : BlockLen(kFmt);
  constexpr int kNibbles = fast::kFp4(kFmt) && kPacked;
  const FloatType out = kOut == kInF32 ? FloatType::kF32 : (kOut == kInBf16 ? FloatType::kBF16 : FloatType::kF16);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < L.chunks; t += stride) {
    const int64_t row = L.per_row(uint32_t(t)), c = t - row * L.cpr;
    const int64_t elem = t * V;
    int64_t scale_row;  // index of the row's first scale entry
    if constexpr (kFmt == kFp8Blockwise128x128) {
      const int64_t o = L.per_matrix(uint32_t(row)), r = row - o * L.m_rows;
      scale_row = (o * L.blocks_along + r / 128) * L.tile_cols;
    } else if constexpr (kFmt == kFp8PerTensor) {
      scale_row = row;
    } else {
      scale_row = row * L.blocks_along;
    }
    const uint32_t g = kFmt == kNvfp4 ? __float_as_uint(a.global_scale[L.per_global(uint32_t(row))]) : kF32One;
    {
      const uint4 q = *reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(a.data) + (kNibbles ? elem / 2 : elem));
      const uint32_t words[4] = {q.x, q.y, q.z, q.w};
      constexpr int kNb = V > B ? V / B : 1;
      constexpr int kPer = V / kNb;
      uint32_t scale[kNb];
      float m0[kNb], m1[kNb];
      bool fast_ok = true;
#pragma unroll
      for (int b = 0; b < kNb; ++b) {
        const int64_t si = kFmt == kFp8PerTensor ? scale_row : scale_row + (c * V + b * kPer) / B;
        scale[b] = LoadScale(a.scale, kFmt, si);
        fast_ok = fast::DequantParams<kFmt>(scale[b], g, &m0[b], &m1[b]) && fast_ok;
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) fast_ok = fast_ok && !fast::AnySpecialCode4<kFmt>(words[j]);
#pragma unroll
      for (int h = 0; h < V / 16; ++h) {  // 16 outputs at a time (packed FP4: two halves of 16)
        if (fast_ok) {
          float f[16];
#pragma unroll
          for (int j = 0; j < 16; j += 2) {
            const int e = h * 16 + j;
            uint32_t pair;
            if constexpr (kNibbles) {
              const uint32_t byte = (words[e / 8] >> (4 * (e % 8))) & 0xFFu;
              pair = (byte & 0xFu) | ((byte >> 4) << 8);
            } else {
              pair = (words[e / 4] >> (8 * (e % 4))) & 0xFFFFu;
            }
            const float2 vv = CodePairValues<kFmt>(pair);
            const int b = e / kPer;
            f[j] = MulRn(vv.x, m0[b]);
            f[j + 1] = MulRn(vv.y, m0[b]);
            if constexpr (kFmt == kNvfp4) {
              f[j] = MulRn(f[j], m1[b]);
              f[j + 1] = MulRn(f[j + 1], m1[b]);
            }
          }
          StoreOut<kOut>(a.y, elem + h * 16, f);
        } else {
          uint32_t bits[16];
#pragma unroll
          for (int j = 0; j < 16; ++j) {
            const int e = h * 16 + j;
            const uint32_t code = kNibbles ? (words[e / 8] >> (4 * (e % 8))) & 0xFu : (words[e / 4] >> (8 * (e % 4))) & 0xFFu;
            bits[j] = fast::DequantizeSlow<kFmt>(code, scale[e / kPer], g, OutputFormat(out));
          }
          StoreOutBits<kOut>(a.y, elem + h * 16, bits);
        }
      }
    }
  }
}

}  // namespace gpuext::formats::vec
