// CPU quantize / dequantize. One template instance per (block format, input or output type):
// the per-element work (block_scaled_cpu_kernels.h) has no switch, and its loops run over
// contiguous memory so the compiler vectorises them. Three layouts:
//  - runs:    blocks contiguous in memory (quantized axis last, FP8_TENSOR, rows of a 128x128 tile),
//  - strided: blocks along a non-last axis; a run of columns is processed at once, one scale per lane,
//  - tiles:   FP8_128x128, a row of tiles at a time (amax over the tile, then runs per tile row).
// Work is split across the caller's thread pool by independent units (blocks, block rows, tile rows).
#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "csrc/common/parallel.h"
#include "csrc/formats/block_scaled.h"
#include "csrc/formats/block_scaled_cpu_kernels.h"
#include "csrc/formats/block_scaled_io.h"

namespace gpuext::formats {
namespace {
using namespace cpu;

constexpr int64_t kChunk = 512;  // columns per strided step; codes per packing buffer
constexpr int64_t kPerTensorChunk = kChunk * 16;  // FP8_TENSOR: elements per parallel unit

// Codes of elements [e0, e0 + n) into the element buffer: bytes, or FP4 nibbles (element 2i low).
// Edge nibbles are read-modify-write; callers split work only at even elements, so no byte
// is written by two threads.
void StoreCodes(void* data, bool packed, int64_t e0, const uint8_t* codes, int64_t n) {
  uint8_t* p = static_cast<uint8_t*>(data);
  if (!packed) {
    std::memcpy(p + e0, codes, size_t(n));
    return;
  }
  int64_t i = 0;
  if (e0 & 1) StoreElementCodeSequential(data, true, e0 + i++, codes[0]);
  uint8_t* bytes = p + (e0 + i) / 2;
  const int64_t pairs = (n - i) / 2;
  for (int64_t j = 0; j < pairs; ++j) bytes[j] = uint8_t(Fp4PackPair(codes[i + 2 * j], codes[i + 2 * j + 1]));
  i += 2 * pairs;
  if (i < n) StoreElementCodeSequential(data, true, e0 + i, codes[i]);
}

// Element codes [e0, e0 + n) as one byte each: the buffer itself, or unpacked into buf.
const uint8_t* LoadCodes(const void* data, bool packed, int64_t e0, int64_t n, uint8_t* buf) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  if (!packed) return p + e0;
  if (e0 % 2 == 0) {  // whole bytes: a loop the compiler vectorises
    const uint8_t* bytes = p + e0 / 2;
    for (int64_t j = 0; j < n / 2; ++j) {
      buf[2 * j] = uint8_t(bytes[j] & 0xF);
      buf[2 * j + 1] = uint8_t(bytes[j] >> 4);
    }
    if (n % 2) buf[n - 1] = uint8_t(bytes[n / 2] & 0xF);
    return buf;
  }
  for (int64_t i = 0; i < n; ++i) buf[i] = uint8_t((p[(e0 + i) >> 1] >> (((e0 + i) & 1) * 4)) & 0xF);
  return buf;
}

// N > 0: n is N, known at compile time (a whole block): whole 32-byte vectors, max'ed lane by
// lane, then one reduction across the lanes (a loop with the reduction the compiler picks cost
// 2x more for NVFP4's 16-blocks; measured).
template <class In, int64_t N = 0>
uint32_t AbsMaxF32(const typename In::T* x, int64_t n) {
  // Signed compare: |bits| < 2^31 (2^15 for 16-bit inputs), and SSE2 has signed max/compare only.
  using S = std::conditional_t<sizeof(typename In::T) == 4, int32_t, int16_t>;
  constexpr int64_t kLanes = 32 / sizeof(S);
  if constexpr (N > 0 && N % kLanes == 0) {
    typedef S V __attribute__((vector_size(32)));
    V m = {};
    for (int64_t i = 0; i < N; i += kLanes) {
      V v;
      std::memcpy(&v, x + i, 32);
      v &= S(In::Abs(typename In::T(~0u)));  // the |x| mask of the input type
      m = v > m ? v : m;
    }
    // Halving steps (a scalar loop here was compiled to one lane extraction per lane).
    V t;
    if constexpr (kLanes == 16) {
      t = __builtin_shufflevector(m, m, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
      m = t > m ? t : m;
      t = __builtin_shufflevector(m, m, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
      m = t > m ? t : m;
      t = __builtin_shufflevector(m, m, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
      m = t > m ? t : m;
      t = __builtin_shufflevector(m, m, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
    } else {
      t = __builtin_shufflevector(m, m, 4, 5, 6, 7, 0, 1, 2, 3);
      m = t > m ? t : m;
      t = __builtin_shufflevector(m, m, 2, 3, 0, 1, 6, 7, 4, 5);
      m = t > m ? t : m;
      t = __builtin_shufflevector(m, m, 1, 0, 3, 2, 5, 4, 7, 6);
    }
    m = t > m ? t : m;
    return In::AbsToF32(uint32_t(m[0]));
  }
  if constexpr (N > 0) n = N;
  S m = 0;
  for (int64_t i = 0; i < n; ++i) {
    const S v = S(In::Abs(x[i]));
    m = v > m ? v : m;
  }
  return In::AbsToF32(uint32_t(m));
}

// The amaxes of 16 consecutive 16-element blocks of 16-bit input (NVFP4's bf16 / f16 blocks),
// as fp32 bits: a transposing reduction, so 16 blocks cost 15 maxes of pairs of interleaved
// registers instead of 16 reductions across one register's lanes. Level by level, each
// register holds partial maxima of 2, 4, 8, then 16 blocks, in block order (the shuffles are
// unpack-low/high of 16-, 32- and 64-bit lanes, then of 128-bit halves).
template <class In>
void AbsMax16Blocks16(const typename In::T* x, uint32_t* amax) {
  typedef int16_t V __attribute__((vector_size(32)));
  // Pairs of blocks are loaded straight into the first level: a V r[16] of loaded blocks lived on
  // the stack in the AVX2 clone (16 registers in all), filled by two 16-byte stores per block and
  // read back as one 32-byte load, which cannot be store-forwarded: 46% of NVFP4's time on Zen 3.
  V r[8];
  V lo, hi;  // (no lambda over V: passing V by value is an ABI the baseline clone lacks)
  for (int b = 0; b < 8; ++b) {  // pairs of blocks, interleaved by 16-bit lane
    V p, q;
    std::memcpy(&p, x + 32 * b, 32);
    std::memcpy(&q, x + 32 * b + 16, 32);
    p &= int16_t(0x7FFF);
    q &= int16_t(0x7FFF);
    lo = __builtin_shufflevector(p, q, 0, 16, 1, 17, 2, 18, 3, 19, 8, 24, 9, 25, 10, 26, 11, 27);
    hi = __builtin_shufflevector(p, q, 4, 20, 5, 21, 6, 22, 7, 23, 12, 28, 13, 29, 14, 30, 15, 31);
    r[b] = lo > hi ? lo : hi;
  }
  for (int b = 0; b < 4; ++b) {  // fours, by 32-bit lane
    lo = __builtin_shufflevector(r[2 * b], r[2 * b + 1], 0, 1, 16, 17, 2, 3, 18, 19, 8, 9, 24, 25, 10, 11, 26, 27);
    hi = __builtin_shufflevector(r[2 * b], r[2 * b + 1], 4, 5, 20, 21, 6, 7, 22, 23, 12, 13, 28, 29, 14, 15, 30, 31);
    r[b] = lo > hi ? lo : hi;
  }
  for (int b = 0; b < 2; ++b) {  // eights, by 64-bit lane
    lo = __builtin_shufflevector(r[2 * b], r[2 * b + 1], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
    hi = __builtin_shufflevector(r[2 * b], r[2 * b + 1], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
    r[b] = lo > hi ? lo : hi;
  }
  lo = __builtin_shufflevector(r[0], r[1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
  hi = __builtin_shufflevector(r[0], r[1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  const V m = lo > hi ? lo : hi;  // lane b: block b's amax
  for (int b = 0; b < 16; ++b) amax[b] = In::AbsToF32(uint32_t(uint16_t(m[b])));
}

// Software prefetch of the input a later step reads: [p + d, p + d + bytes) with d = max(bytes,
// 4 KiB), called once per step of `bytes` along a stream, so each line is asked for once, a step
// or a page ahead. The hardware prefetcher stops at 4 KiB pages; this saved 8-14% of MX and
// FP8_1x128 quantize time and 1-3% of the others' on a busy Zen 3 (measured). Past the end of
// the array it asks for lines nobody reads: a prefetch never faults.
inline void PrefetchAhead(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p) + std::max<int64_t>(bytes, 4096);
  for (int64_t l = 0; l < bytes; l += 64) __builtin_prefetch(c + l);
}

// count stored scales from scale index i (a local pointer: stores through a.scale would make
// the compiler reload it after every byte store).
void StoreScales(void* scale, int32_t format, int64_t i, const uint32_t* stored, int64_t count) {
  if (HasF32Scale(format)) {
    std::memcpy(static_cast<uint32_t*>(scale) + i, stored, size_t(count) * 4);
    return;
  }
  uint8_t* s = static_cast<uint8_t*>(scale) + i;
  for (int64_t j = 0; j < count; ++j) s[j] = uint8_t(stored[j]);
}

uint32_t GlobalBits(const BlockScaledGeometry& g, const float* gs, int64_t o) {
  return gs ? FloatToBits(gs[o / (g.outer / g.global_count)]) : kF32One;
}

// ------------------------------------------------------------------------------- quantize
template <class Fmt, class In>
struct Quantize {
  using T = typename In::T;
  static constexpr bool kBf16Pow2 = std::is_same_v<In, InBF16> && Fmt::kPow2;  // QuantizeBf16Pow2 applies
  static constexpr bool kBf16Div = std::is_same_v<In, InBF16> && !Fmt::kPow2;  // QuantizeBf16Div applies
  static constexpr bool kBf16Nvfp4 = std::is_same_v<In, InBF16> && Fmt::kFormat == kNvfp4;  // Nvfp4Bf16Table
  struct NoTable {};
  using Table = std::conditional_t<kBf16Nvfp4, Nvfp4Bf16Table, NoTable>;  // one per thread's part
  const QuantizeArgs& a;
  const T* x = static_cast<const T*>(a.x);

  BlockScale Scale(uint32_t amax, int64_t o) const {
    return BlockScaleOf<Fmt>(amax, a.scale_rounding, GlobalBits(a.geo, a.global_scale, o));
  }

  // n contiguous elements from e0 sharing the block scale s (N > 0: n is N, a whole block).
  template <int64_t N = 0>
  void Run(int64_t e0, int64_t n, const BlockScale& s) const {
    if constexpr (N > 0) n = N;
    float p = 1.0f;
    const bool fast = QuantFastScale<Fmt>(s, &p);
    const float gf = AsFloat(s.g);  // NVFP4 divides by g first; other formats ignore it
    const bool div_loop = kBf16Div && Bf16DivLoopPays();
    uint8_t buf[kChunk];
    for (int64_t c = 0; c < n; c += kChunk) {
      const int64_t m = std::min(kChunk, n - c);
      const T* xs = x + e0 + c;
      if (n > kChunk) PrefetchAhead(xs, m * int64_t(sizeof(T)));  // long runs: FP8_TENSOR's chunks
      uint8_t* out = a.geo.fp4_packed ? buf : static_cast<uint8_t*>(a.data) + e0 + c;
      if constexpr (kBf16Div) {
        if (fast && div_loop) {
          QuantizeBf16Div<Fmt>(xs, m, p, gf, out);
          if (a.geo.fp4_packed) StoreCodes(a.data, true, e0 + c, buf, m);
          continue;
        }
      }
      if (fast) {
        uint16_t slow = 1;
        if constexpr (kBf16Pow2) {
          slow = 0;
          const int16_t kshift = int16_t(s.k * 128);
          for (int64_t i = 0; i < m; ++i) out[i] = QuantizeBf16Pow2<Fmt>(xs[i], kshift, slow);
        }
        if (slow)
          for (int64_t i = 0; i < m; ++i) out[i] = QuantizeFast<Fmt>(In::Bits(xs[i]), p, gf);
      } else {
        for (int64_t i = 0; i < m; ++i) out[i] = uint8_t(QuantizeElement(Fmt::kFormat, s, uint32_t(In::Bits(xs[i]))));
      }
      if (a.geo.fp4_packed) StoreCodes(a.data, true, e0 + c, buf, m);
    }
  }

  // One block u = (o, b) of a row, n elements from e0: a row's partial last block (whole blocks
  // go through Blocks).
  void OneBlock(int64_t u, int64_t o, int64_t e0, int64_t n) const {
    const BlockScale s = Scale(AbsMaxF32<In>(x + e0, n), o);
    StoreScale(a.scale, Fmt::kFormat, u, s.stored);
    Run(e0, n, s);
  }

  // `count` (<= kGroup) whole blocks of row o from block u, element e0: their amaxes, then their
  // scales in one branch-free pass (SimpleBlockScale: a loop the compiler vectorises; blocks it
  // declines take BlockScaleOf), then the codes. The scales are BlockScaleOf's exactly.
  static constexpr int64_t kGroup = 64;
  void Blocks(int64_t u, int64_t o, int64_t e0, int64_t count, Table& table) const {
    constexpr int64_t kB = Fmt::kBlock;
    uint32_t amax[kGroup], stored[kGroup], m[kGroup], simple[kGroup];
    int32_t k[kGroup];
    int64_t j0 = 0;
    if constexpr (sizeof(T) == 2 && kB == 16)
      for (; j0 + 16 <= count; j0 += 16) AbsMax16Blocks16<In>(x + e0 + j0 * kB, amax + j0);
    for (int64_t j = j0; j < count; ++j) amax[j] = AbsMaxF32<In, kB>(x + e0 + j * kB, kB);
    PrefetchAhead(x + e0, count * kB * int64_t(sizeof(T)));
    const uint32_t up = a.scale_rounding == kRoundUp ? 1u : 0u, gbits = GlobalBits(a.geo, a.global_scale, o);
    const int32_t gk = GlobalK(gbits);
    const float gf = AsFloat(gbits);
    for (int64_t j = 0; j < count; ++j) simple[j] = SimpleBlockScale<Fmt>(amax[j], up, gbits, &stored[j], &k[j], &m[j]);
    if constexpr (kBf16Pow2) {
      // bf16 x MX: one element loop over the group, each element with its block's k << 7, so the
      // `slow` flag is reduced across lanes once per group instead of once per 32-element block
      // (that reduction and its branch were a third of MXFP8's time; measured). Blocks with a
      // slow lane (subnormal codes) are found and redone in fp32; a group with a block off the
      // fast path runs block by block below.
      int16_t ke[kGroup * kB];
      uint32_t all = 1;
      for (int64_t j = 0; j < count; ++j) all &= simple[j] & QuantFastK<Fmt>(k[j]);
      if (all) {
        for (int64_t j = 0; j < count; ++j)
          for (int64_t t = 0; t < kB; ++t) ke[j * kB + t] = int16_t(k[j] * 128);
        uint8_t codes[kGroup * kB];
        uint8_t* out = a.geo.fp4_packed ? codes : static_cast<uint8_t*>(a.data) + e0;
        const T* xs = x + e0;
        const int64_t n = count * kB;
        uint16_t slow = 0;
        for (int64_t i = 0; i < n; ++i) out[i] = QuantizeBf16Pow2<Fmt>(xs[i], ke[i], slow);
        if (slow) {  // subnormal E4M3 / E5M2 codes somewhere: find their blocks, redo those in fp32
          for (int64_t j = 0; j < count; ++j) {
            uint16_t sj = 0;
            for (int64_t t = 0; t < kB; ++t) (void)QuantizeBf16Pow2<Fmt>(xs[j * kB + t], ke[j * kB + t], sj);
            if (!sj) continue;
            const float pj = QuantFastParam<Fmt>(k[j], m[j]);
            for (int64_t t = 0; t < kB; ++t) out[j * kB + t] = QuantizeFast<Fmt>(In::Bits(xs[j * kB + t]), pj);
          }
        }
        if (a.geo.fp4_packed) StoreCodes(a.data, true, e0, codes, n);
        StoreScales(a.scale, Fmt::kFormat, u, stored, count);
        return;
      }
    }
    if constexpr (!kBf16Pow2 && kB <= 32) {
      // Short blocks (NVFP4's 16): one long element loop over the group, each element with its
      // block's divisor, instead of a 16-element loop per block (vectorised only 4 wide) and a
      // packing loop per block: measured 1.6x on NVFP4. Only when every block is fast.
      float p[kGroup];
      uint32_t all = 1;
      for (int64_t j = 0; j < count; ++j) {  // QuantFastScale, branch-free (a vectorised loop)
        p[j] = QuantFastParam<Fmt>(k[j], m[j]);
        all &= simple[j] & QuantFastK<Fmt>(k[j], gk);
      }
      if constexpr (kBf16Nvfp4) {
        // bf16 x NVFP4: compares, no division (Nvfp4Bf16Table). A packed row of odd length can
        // start mid-byte; it takes the general loop below.
        const bool packed = a.geo.fp4_packed;
        if (all && (!packed || e0 % 2 == 0)) {
          if (!table.built || table.g != gbits) table.Build(gbits);
          uint8_t* out = static_cast<uint8_t*>(a.data) + (packed ? e0 / 2 : e0);
          if (packed) {
            for (int64_t j = 0; j < count; ++j)
              QuantizeNvfp4Bf16Block<true>(x + e0 + j * kB, table.u[stored[j] & 0x7F], out + j * kB / 2);
          } else {
            for (int64_t j = 0; j < count; ++j)
              QuantizeNvfp4Bf16Block<false>(x + e0 + j * kB, table.u[stored[j] & 0x7F], out + j * kB);
          }
          StoreScales(a.scale, Fmt::kFormat, u, stored, count);
          return;
        }
      }
      if (all) {
        float pe[kGroup * kB];
        uint8_t codes[kGroup * kB];
        for (int64_t j = 0; j < count; ++j)
          for (int64_t t = 0; t < kB; ++t) pe[j * kB + t] = p[j];
        const T* xs = x + e0;
        const int64_t n = count * kB;
        uint8_t* out = a.geo.fp4_packed ? codes : static_cast<uint8_t*>(a.data) + e0;
        for (int64_t i = 0; i < n; ++i) out[i] = QuantizeFast<Fmt>(In::Bits(xs[i]), pe[i], gf);
        if (a.geo.fp4_packed) StoreCodes(a.data, true, e0, codes, n);
        StoreScales(a.scale, Fmt::kFormat, u, stored, count);
        return;
      }
    }
    for (int64_t j = 0; j < count; ++j) {
      const BlockScale s = simple[j] ? BlockScale{stored[j], false, k[j], m[j], gbits} : Scale(amax[j], o);
      StoreScale(a.scale, Fmt::kFormat, u + j, s.stored);
      Run<kB>(e0 + j * kB, kB, s);
    }
  }

  // Units: blocks (o, b) with the quantized axis last; blocks along K are contiguous.
  GPUEXT_CPU_HOT void Contiguous(int64_t begin, int64_t end) const {
    const BlockScaledGeometry& g = a.geo;
    const int64_t nb = g.blocks_along(), whole = g.k / g.block;  // whole blocks per row
    Table table;
    for (int64_t u = begin, o = begin / nb, b = begin % nb; u < end;) {
      int64_t count = 1;
      const int64_t e0 = o * g.k + b * g.block;
      if (Fmt::kBlock > 0 && g.block == Fmt::kBlock && b < whole) {
        count = std::min({end - u, whole - b, kGroup});
        Blocks(u, o, e0, count, table);
      } else {
        OneBlock(u, o, e0, std::min(g.block, g.k - b * g.block));
      }
      u += count;
      b += count;
      if (b == nb) b = 0, ++o;
    }
  }

  // Units: block rows (o, b) of a non-last quantized axis; columns i run in lanes.
  GPUEXT_CPU_HOT void Strided(int64_t begin, int64_t end) const {
    const BlockScaledGeometry& g = a.geo;
    const int64_t nb = g.blocks_along();
    using S = std::conditional_t<sizeof(T) == 4, int32_t, int16_t>;
    S amax[kChunk];
    float param[kChunk];
    int16_t kshift[kChunk];  // kBf16Pow2: each lane's k << 7
    uint32_t stored[kChunk], ms[kChunk], simple[kChunk];
    int32_t ks[kChunk];
    BlockScale scales[kChunk];
    uint8_t codes[kChunk];
    for (int64_t u = begin; u < end; ++u) {
      const int64_t o = u / nb, b = u % nb;
      const int64_t k0 = b * g.block, rows = std::min(g.block, g.k - k0);
      for (int64_t i0 = 0; i0 < g.inner; i0 += kChunk) {
        const int64_t w = std::min(kChunk, g.inner - i0);
        std::fill(amax, amax + w, S(0));
        for (int64_t r = 0; r < rows; ++r) {
          const T* xs = x + (o * g.k + k0 + r) * g.inner + i0;
          for (int64_t i = 0; i < w; ++i) {
            const S v = S(In::Abs(xs[i]));
            amax[i] = v > amax[i] ? v : amax[i];
          }
        }
        bool all_fast = true;
        const uint32_t up = a.scale_rounding == kRoundUp ? 1u : 0u, gbits = GlobalBits(g, a.global_scale, o);
        const float gf = AsFloat(gbits);
        for (int64_t i = 0; i < w; ++i)  // SimpleBlockScale: see Blocks
          simple[i] = SimpleBlockScale<Fmt>(In::AbsToF32(uint32_t(amax[i])), up, gbits, &stored[i], &ks[i], &ms[i]);
        for (int64_t i = 0; i < w; ++i) {
          scales[i] = simple[i] ? BlockScale{stored[i], false, ks[i], ms[i], gbits} : Scale(In::AbsToF32(uint32_t(amax[i])), o);
          StoreScale(a.scale, Fmt::kFormat, u * g.inner + i0 + i, scales[i].stored);
          param[i] = 1.0f;
          all_fast &= QuantFastScale<Fmt>(scales[i], &param[i]);
          kshift[i] = int16_t(scales[i].k * 128);  // used only in fast lanes, where |k| <= 126
        }
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t e0 = (o * g.k + k0 + r) * g.inner + i0;
          const T* xs = x + e0;
          uint8_t* out = g.fp4_packed ? codes : static_cast<uint8_t*>(a.data) + e0;
          uint16_t slow = 1;
          if constexpr (kBf16Pow2) {
            slow = 0;
            for (int64_t i = 0; i < w; ++i) out[i] = QuantizeBf16Pow2<Fmt>(xs[i], kshift[i], slow);
          }
          if (slow)
            for (int64_t i = 0; i < w; ++i) out[i] = QuantizeFast<Fmt>(In::Bits(xs[i]), param[i], gf);
          if (!all_fast) {
            float unused;
            for (int64_t i = 0; i < w; ++i)
              if (!QuantFastScale<Fmt>(scales[i], &unused))
                out[i] = uint8_t(QuantizeElement(Fmt::kFormat, scales[i], uint32_t(In::Bits(xs[i]))));
          }
          if (g.fp4_packed) StoreCodes(a.data, true, e0, codes, w);
        }
      }
    }
  }

  // Units: rows of 128x128 tiles (o, br). The amax pass keeps a lane-wise max per column over the
  // tile row's rows (a loop the compiler vectorises along whole rows) and reduces each tile's
  // 128 columns once; a max per 128-element run cost a reduction each (measured 1.2x). Tile by
  // tile instead was slower: its rows are 4 KiB apart for 2048 bf16 columns, one L1 set.
  GPUEXT_CPU_HOT void Tiles(int64_t begin, int64_t end) const {
    const BlockScaledGeometry& g = a.geo;
    const int64_t nbr = g.blocks_along(), nbc = g.block_cols();
    using S = std::conditional_t<sizeof(T) == 4, int32_t, int16_t>;
    std::vector<S> col_max(static_cast<size_t>(nbc * 128));
    std::vector<BlockScale> scales(static_cast<size_t>(nbc));
    for (int64_t u = begin; u < end; ++u) {
      const int64_t o = u / nbr, r0 = (u % nbr) * 128, rows = std::min<int64_t>(128, g.k - r0);
      const int64_t e0 = (o * g.k + r0) * g.cols;
      S* acc = col_max.data();
      std::fill(acc, acc + g.cols, S(0));
      for (int64_t r = 0; r < rows; ++r) {
        const T* xs = x + e0 + r * g.cols;
        PrefetchAhead(xs, g.cols * int64_t(sizeof(T)));
        for (int64_t i = 0; i < g.cols; ++i) {
          const S v = S(In::Abs(xs[i]));
          acc[i] = v > acc[i] ? v : acc[i];
        }
      }
      for (int64_t bc = 0; bc < nbc; ++bc) {
        S m = 0;
        for (int64_t i = bc * 128; i < std::min<int64_t>(g.cols, bc * 128 + 128); ++i) m = acc[i] > m ? acc[i] : m;
        scales[bc] = Scale(In::AbsToF32(uint32_t(m)), o);
        StoreScale(a.scale, Fmt::kFormat, u * nbc + bc, scales[bc].stored);
      }
      const int64_t full = g.cols / 128;  // whole tiles per row
      for (int64_t r = 0; r < rows; ++r) {
        PrefetchAhead(x + e0 + r * g.cols, g.cols * int64_t(sizeof(T)));
        for (int64_t bc = 0; bc < full; ++bc) Run<128>(e0 + r * g.cols + bc * 128, 128, scales[bc]);
        if (full < nbc) Run(e0 + r * g.cols + full * 128, g.cols - full * 128, scales[full]);
      }
    }
  }

  // FP8_TENSOR's chunks [b, e) of kPerTensorChunk elements of the tensor at base: their amax, then their codes.
  GPUEXT_CPU_HOT void ChunkAmax(int64_t base, int64_t b, int64_t e, uint32_t* part) const {
    for (int64_t c = b; c < e; ++c) {
      const int64_t lo = c * kPerTensorChunk, hi = std::min(a.geo.k, lo + kPerTensorChunk);
      uint32_t m = 0;
      for (int64_t i = lo; i < hi; i += kChunk) {  // in steps, for PrefetchAhead
        const int64_t w = std::min(kChunk, hi - i);
        PrefetchAhead(x + base + i, w * int64_t(sizeof(T)));
        m = std::max(m, AbsMaxF32<In>(x + base + i, w));
      }
      part[c] = m;
    }
  }
  GPUEXT_CPU_HOT void ChunkRun(int64_t base, int64_t b, int64_t e, const BlockScale& s) const {
    for (int64_t c = b; c < e; ++c) {
      const int64_t lo = c * kPerTensorChunk, hi = std::min(a.geo.k, lo + kPerTensorChunk);
      Run(base + lo, hi - lo, s);
    }
  }

  // FP8_TENSOR: one block per tensor, split in chunks for the amax and again for the rounding.
  void PerTensor(const TaskRunner* runner) const {
    const BlockScaledGeometry& g = a.geo;
    const int64_t chunks = (g.k + kPerTensorChunk - 1) / kPerTensorChunk;
    std::vector<uint32_t> part(static_cast<size_t>(chunks));
    for (int64_t o = 0; o < g.outer; ++o) {
      const int64_t base = o * g.k;
      ParallelFor(runner, chunks, 1, kPerTensorChunk, [&](int64_t b, int64_t e) { ChunkAmax(base, b, e, part.data()); });
      const uint32_t amax = chunks ? *std::max_element(part.begin(), part.end()) : 0u;
      const BlockScale s = Scale(amax, o);
      StoreScale(a.scale, Fmt::kFormat, o, s.stored);
      ParallelFor(runner, chunks, 1, kPerTensorChunk, [&](int64_t b, int64_t e) { ChunkRun(base, b, e, s); });
    }
  }

  void operator()(const TaskRunner* runner) const {
    const BlockScaledGeometry& g = a.geo;
    if (g.per_tensor()) return PerTensor(runner);
    if (g.two_d()) {
      ParallelFor(runner, g.outer * g.blocks_along(), 1, 128 * g.cols,
                  [&](int64_t b, int64_t e) { Tiles(b, e); });
      return;
    }
    const int64_t nb = g.blocks_along();
    // Packed FP4: a part must start at an even element. Unit starts are even when k * inner
    // is even (the block, 16, is); otherwise every other row starts odd, so parts take row pairs.
    const int64_t grain = g.fp4_packed && (g.k * g.inner) % 2 ? 2 * nb : 1;
    if (g.inner == 1) {
      ParallelFor(runner, g.outer * nb, grain, g.block, [&](int64_t b, int64_t e) { Contiguous(b, e); });
    } else {
      ParallelFor(runner, g.outer * nb, grain, g.block * g.inner, [&](int64_t b, int64_t e) { Strided(b, e); });
    }
  }
};

// ------------------------------------------------------------------------------- dequantize
template <class Fmt, class Out>
struct Dequantize {
  using T = typename Out::T;
  const DequantizeArgs& a;
  T* y = static_cast<T*>(a.y);

  // n contiguous elements from e0 sharing one stored scale.
  void Run(int64_t e0, int64_t n, uint32_t scale, uint32_t gbits) const {
    float m0, m1;
    const bool fast = DequantFastScale<Fmt>(scale, gbits, &m0, &m1);
    uint8_t buf[kChunk];
    for (int64_t c = 0; c < n; c += kChunk) {
      const int64_t m = std::min(kChunk, n - c);
      const uint8_t* codes = LoadCodes(a.data, a.geo.fp4_packed, e0 + c, m, buf);
      T* ys = y + e0 + c;
      if (fast) {
        for (int64_t i = 0; i < m; ++i) ys[i] = DequantizeFast<Fmt, Out>(codes[i], m0, m1);
      } else {
        const BitFormat out = OutputFormat(a.out_type);
        for (int64_t i = 0; i < m; ++i) ys[i] = T(DequantizeElement(Fmt::kFormat, codes[i], scale, gbits, out));
      }
    }
  }

  // `count` (<= kGroup) whole blocks of row o from block u, element e0, as one element loop with
  // each element's multipliers copied from its block (a loop per 16- or 32-element block was
  // vectorised badly: NVFP4 7.5 ms single thread at 2048^2, 20 ms in the AVX-512 clone;
  // measured). Any block off the fast path sends the group through Run, block by block.
  static constexpr int64_t kGroup = 64;
  void Blocks(int64_t u, int64_t o, int64_t e0, int64_t count) const {
    constexpr int64_t kB = Fmt::kBlock;
    const uint32_t gbits = GlobalBits(a.geo, a.global_scale, o);
    float m0[kGroup], m1[kGroup];
    bool all = true;
    for (int64_t j = 0; j < count; ++j) all &= DequantFastScale<Fmt>(LoadScale(a.scale, Fmt::kFormat, u + j), gbits, &m0[j], &m1[j]);
    if (!all) {
      for (int64_t j = 0; j < count; ++j) Run(e0 + j * kB, kB, LoadScale(a.scale, Fmt::kFormat, u + j), gbits);
      return;
    }
    float m0e[kGroup * kB], m1e[kGroup * kB];
    uint8_t buf[kGroup * kB];
    for (int64_t j = 0; j < count; ++j)
      for (int64_t t = 0; t < kB; ++t) m0e[j * kB + t] = m0[j], m1e[j * kB + t] = m1[j];
    const int64_t n = count * kB;
    const uint8_t* codes = LoadCodes(a.data, a.geo.fp4_packed, e0, n, buf);
    T* ys = y + e0;
    for (int64_t i = 0; i < n; ++i) ys[i] = DequantizeFast<Fmt, Out>(codes[i], m0e[i], m1e[i]);
  }

  GPUEXT_CPU_HOT void Contiguous(int64_t begin, int64_t end) const {
    const BlockScaledGeometry& g = a.geo;
    const int64_t nb = g.blocks_along(), whole = g.k / g.block;
    for (int64_t u = begin, o = begin / nb, b = begin % nb; u < end;) {
      int64_t count = 1;
      const int64_t e0 = o * g.k + b * g.block;
      if (Fmt::kBlock > 0 && Fmt::kBlock <= 32 && g.block == Fmt::kBlock && b < whole) {
        count = std::min({end - u, whole - b, kGroup});
        Blocks(u, o, e0, count);
      } else {
        Run(e0, std::min(g.block, g.k - b * g.block), LoadScale(a.scale, Fmt::kFormat, u), GlobalBits(g, a.global_scale, o));
      }
      u += count;
      b += count;
      if (b == nb) b = 0, ++o;
    }
  }

  GPUEXT_CPU_HOT void Strided(int64_t begin, int64_t end) const {
    const BlockScaledGeometry& g = a.geo;
    const int64_t nb = g.blocks_along();
    const BitFormat out = OutputFormat(a.out_type);
    float m0[kChunk], m1[kChunk];
    bool fast[kChunk];
    uint8_t buf[kChunk];
    for (int64_t u = begin; u < end; ++u) {
      const int64_t o = u / nb, k0 = (u % nb) * g.block, rows = std::min(g.block, g.k - k0);
      const uint32_t gbits = GlobalBits(g, a.global_scale, o);
      for (int64_t i0 = 0; i0 < g.inner; i0 += kChunk) {
        const int64_t w = std::min(kChunk, g.inner - i0);
        bool all_fast = true;
        for (int64_t i = 0; i < w; ++i) {
          fast[i] = DequantFastScale<Fmt>(LoadScale(a.scale, Fmt::kFormat, u * g.inner + i0 + i), gbits, &m0[i], &m1[i]);
          all_fast &= fast[i];
        }
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t e0 = (o * g.k + k0 + r) * g.inner + i0;
          const uint8_t* codes = LoadCodes(a.data, g.fp4_packed, e0, w, buf);
          T* ys = y + e0;
          for (int64_t i = 0; i < w; ++i) ys[i] = DequantizeFast<Fmt, Out>(codes[i], m0[i], m1[i]);
          if (!all_fast)
            for (int64_t i = 0; i < w; ++i)
              if (!fast[i])
                ys[i] = T(DequantizeElement(Fmt::kFormat, codes[i], LoadScale(a.scale, Fmt::kFormat, u * g.inner + i0 + i),
                                            gbits, out));
        }
      }
    }
  }

  // Units: chunks of kPerTensorChunk elements of FP8_TENSOR tensors (chunks per tensor).
  GPUEXT_CPU_HOT void Chunks(int64_t chunks, int64_t begin, int64_t end) const {
    const BlockScaledGeometry& g = a.geo;
    for (int64_t c = begin; c < end; ++c) {
      const int64_t o = c / chunks, lo = (c % chunks) * kPerTensorChunk;
      Run(o * g.k + lo, std::min(kPerTensorChunk, g.k - lo), LoadScale(a.scale, Fmt::kFormat, o), kF32One);
    }
  }

  // Units: rows of elements (o, r) of FP8_128x128; each row is runs of 128 with one scale each.
  GPUEXT_CPU_HOT void TileRows(int64_t begin, int64_t end) const {
    const BlockScaledGeometry& g = a.geo;
    const int64_t nbr = g.blocks_along(), nbc = g.block_cols();
    for (int64_t u = begin; u < end; ++u) {
      const int64_t o = u / g.k, r = u % g.k;
      for (int64_t bc = 0; bc < nbc; ++bc)
        Run(u * g.cols + bc * 128, std::min<int64_t>(128, g.cols - bc * 128),
            LoadScale(a.scale, Fmt::kFormat, (o * nbr + r / 128) * nbc + bc), kF32One);
    }
  }

  void operator()(const TaskRunner* runner) const {
    const BlockScaledGeometry& g = a.geo;
    if (g.two_d()) {
      ParallelFor(runner, g.outer * g.k, 1, g.cols, [&](int64_t b, int64_t e) { TileRows(b, e); });
    } else if (g.per_tensor()) {  // one scale per tensor: any split of a tensor is independent
      const int64_t chunks = (g.k + kPerTensorChunk - 1) / kPerTensorChunk;
      ParallelFor(runner, g.outer * chunks, 1, kPerTensorChunk, [&](int64_t b, int64_t e) { Chunks(chunks, b, e); });
    } else if (g.inner == 1) {
      ParallelFor(runner, g.outer * g.blocks_along(), 1, g.block, [&](int64_t b, int64_t e) { Contiguous(b, e); });
    } else {
      ParallelFor(runner, g.outer * g.blocks_along(), 1, g.block * g.inner,
                  [&](int64_t b, int64_t e) { Strided(b, e); });
    }
  }
};

// ------------------------------------------------------------------------------- dispatch
// The only switches: format x type, once per call.
template <template <class, class> class Op, class T0, class T1, class T2, class Args>
Status Dispatch(const Args& args, FloatType t, const TaskRunner* runner) {
  auto run = [&](auto fmt) {
    using Fmt = decltype(fmt);
    switch (t) {
      case FloatType::kF32: Op<Fmt, T0>{args}(runner); break;
      case FloatType::kBF16: Op<Fmt, T1>{args}(runner); break;
      default: Op<Fmt, T2>{args}(runner); break;
    }
    return Status::Ok();
  };
  switch (args.geo.format) {
    case kMxfp8E4m3: return run(MxE4M3{});
    case kMxfp8E5m2: return run(MxE5M2{});
    case kNvfp4: return run(Nvfp4{});
    case kMxfp4: return run(Mxfp4{});
    case kFp8Blockwise1x128: return run(Fp8Scaled<kFp8Blockwise1x128>{});
    case kFp8Blockwise128x128: return run(Fp8Scaled<kFp8Blockwise128x128>{});
    case kFp8PerTensor: return run(Fp8Scaled<kFp8PerTensor>{});
    default: return Status::Error("unknown format " + std::to_string(args.geo.format));
  }
}

Status CheckGlobalCount(const BlockScaledGeometry& g) {
  if (g.global_count <= 0 || g.outer % g.global_count != 0)
    return Status::Error("global scale count " + std::to_string(g.global_count) + " does not divide " +
                         std::to_string(g.outer) + " leading rows");
  return Status::Ok();
}

}  // namespace

const char* CpuKernelClone() {
#if defined(GPUEXT_CPU_CLONES)
  // The clone GCC's resolver picks: the first of v4, v3 whose ISA level the CPU supports.
#if defined(GPUEXT_CPU_AVX512_CLONE)
  if (__builtin_cpu_supports("x86-64-v4")) return "x86-64-v4 (AVX-512)";
#endif
#if __GNUC__ >= 12
  if (__builtin_cpu_supports("x86-64-v3")) return "x86-64-v3 (AVX2)";
#else  // GCC 11 cannot name the level: its core features
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2"))
    return "x86-64-v3 (AVX2)";
#endif
  return "baseline x86-64 (SSE2)";
#elif defined(__x86_64__)
  return "baseline x86-64 (SSE2), no clones in this build";
#else
  return "portable, no clones in this build";
#endif
}

Status QuantizeCpu(const QuantizeArgs& a, const TaskRunner* runner) {
  if (Status s = CheckGlobalCount(a.geo); !s.ok()) return s;
  return Dispatch<Quantize, InF32, InBF16, InF16>(a, a.in_type, runner);
}

Status DequantizeCpu(const DequantizeArgs& a, const TaskRunner* runner) {
  if (Status s = CheckGlobalCount(a.geo); !s.ok()) return s;
  return Dispatch<Dequantize, OutF32, OutBF16, OutF16>(a, a.out_type, runner);
}

}  // namespace gpuext::formats
