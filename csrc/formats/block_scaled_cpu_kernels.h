// Per-element CPU kernels of the block-scaled formats, specialised at compile time per format
// (a trait struct) and per input/output type, written so that GCC/Clang vectorise the loops
// with the baseline ISA (SSE2 on x86-64): branch-free selects, constant shifts, signed 32-bit
// compares, float multiply/divide/add. No per-element switch on the format.
//
// Exactness under XLA's FTZ/DAZ (docs/design.md "CPU speed (issue 18)"): the fast path uses
// float arithmetic only where neither FTZ nor DAZ can change a bit of the result:
//  - fp32 -> element code: normal fp32 values round on their integer bits; values below the
//    element's smallest normal round through `v + magic` (magic: the power of two whose ulp is the
//    element's subnormal step), whose operands and result are normal whenever the code can be
//    non-zero; a v lost to FTZ/DAZ is below half the smallest subnormal, so its code is 0 anyway.
//  - the scaling itself (x * 2^-e, x / s, code * s [* g]) is one IEEE operation, which equals the
//    unbounded-exponent RN of block_scaled_math.h whenever its result is a normal fp32. Each block
//    checks, from its scale alone, that every result that can matter is normal (kQuantMinScaleK,
//    DequantFastScale); blocks that fail (tiny or huge scales, NaN/Inf) run the scalar rules of
//    block_scaled_math.h element by element. tests/formats/test_formats.py covers both sides.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "csrc/formats/block_scaled_math.h"

// The loops that touch every element are compiled three times on x86-64 with GCC: for
// x86-64-v4 (AVX-512: 16 fp32 lanes, masks, narrowing stores), x86-64-v3 (AVX2: 8 fp32 lanes)
// and the baseline (SSE2), picked once at load time by the CPU (an ifunc). `flatten` inlines
// the per-element functions above into each clone, so they are compiled for that clone's ISA;
// the header's own functions stay baseline (no ODR mix). The bits are the same in every clone:
// integer ops and single IEEE operations, no FMA (-ffp-contract=off). Measured (docs/design.md
// "CPU speed"): the v4 clone 0-26% faster than v3 for every format. GPUEXT_CPU_NO_AVX512 drops
// the v4 clone; GPUEXT_CPU_NO_MULTIVERSION builds the baseline alone. CI's sanitizer leg builds
// one level below what the other legs run on its machine, so two clones are tested per run.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11 && \
    !defined(GPUEXT_CPU_NO_MULTIVERSION)
#define GPUEXT_CPU_CLONES 1
#if defined(GPUEXT_CPU_NO_AVX512) || __GNUC__ < 12  // GCC 12: the first with x86-64-v4 clones
#define GPUEXT_CPU_HOT __attribute__((target_clones("arch=x86-64-v3", "default"), flatten))
#else
#define GPUEXT_CPU_HOT __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"), flatten))
#define GPUEXT_CPU_AVX512_CLONE 1  // an AVX-512 CPU runs the v4 clone
#endif
#else
#define GPUEXT_CPU_HOT __attribute__((flatten))
#endif

namespace gpuext::formats::cpu {

inline float AsFloat(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
inline uint32_t AsBits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// ------------------------------------------------------------------------ element formats
// Everything a loop needs about an element (or output) format, as compile-time constants.
template <BitFormat (*Fmt)()>
struct Elem {
  static constexpr BitFormat kF = Fmt();
  static constexpr int32_t kMbits = kF.mbits, kEmin = 1 - kF.bias;
  static constexpr int32_t kSignShift = kF.ebits + kF.mbits;
  static constexpr int32_t kMagMask = (1 << kSignShift) - 1;
  // fp32 bits of the smallest normal, and of the power of two whose ulp is the subnormal step.
  static constexpr int32_t kMinNormalBits = (kEmin + 127) << 23;
  static constexpr int32_t kMagicBits = (kEmin - kMbits + 23 + 127) << 23;
  static constexpr int32_t kRebias = (127 - kF.bias) << kMbits;  // fp32 exponent -> element exponent
};
using E4M3 = Elem<E4M3Format>;
using E5M2 = Elem<E5M2Format>;
using E2M1 = Elem<E2M1Format>;
using F16 = Elem<F16Format>;

// |fp32| bits (finite, or +Inf) -> the element code, round to nearest even, saturating at the
// largest finite code (limit) or, for outputs with Inf, at Inf (limit = max_code + 1).
template <class E>
inline int32_t RoundMagnitude(int32_t b, int32_t limit) {
  constexpr int32_t drop = 23 - E::kMbits;
  // Unsigned: b may be a NaN's bits in a lane the caller discards (the vectoriser evaluates both
  // sides of a select), where a signed sum could overflow; for b <= 0x7FFFFFFF no bit differs.
  const uint32_t ub = uint32_t(b);
  const int32_t normal = int32_t((ub + ((1u << (drop - 1)) - 1u) + ((ub >> drop) & 1u)) >> drop) - E::kRebias;
  const int32_t sub = int32_t(AsBits(AsFloat(uint32_t(b)) + AsFloat(E::kMagicBits))) - E::kMagicBits;
  const int32_t code = b >= E::kMinNormalBits ? normal : sub;
  return code < limit ? code : limit;
}

// An element code's magnitude -> its exact value as fp32 bits (0, subnormals and normals of E).
template <class E>
inline int32_t MagnitudeToF32(int32_t mag) {
  // Unsigned: callers evaluate discarded lanes too (e.g. a block whose global scale is invalid
  // gives a negative code there), and a negative int shifted left is undefined (UBSan).
  const int32_t normal = int32_t((uint32_t(mag) << (23 - E::kMbits)) + (uint32_t(127 - E::kF.bias) << 23));
  const int32_t sub = int32_t(AsBits(AsFloat(uint32_t(E::kMagicBits + mag)) - AsFloat(E::kMagicBits)));
  return mag >= (1 << E::kMbits) ? normal : sub;
}

// ------------------------------------------------------------------------ input / output types
struct InF32 {
  using T = uint32_t;
  static constexpr uint32_t kAbsMask = kF32AbsMask;
  static uint32_t Abs(T v) { return v & kAbsMask; }
  static uint32_t AbsToF32(uint32_t a) { return a; }
  static int32_t Bits(T v) { return int32_t(v); }  // fp32 bits, sign in bit 31
};
struct InBF16 {
  using T = uint16_t;
  static uint32_t Abs(T v) { return v & 0x7FFFu; }
  static uint32_t AbsToF32(uint32_t a) { return a << 16; }
  static int32_t Bits(T v) { return int32_t(uint32_t(v) << 16); }
};
struct InF16 {
  using T = uint16_t;
  static uint32_t Abs(T v) { return v & 0x7FFFu; }
  static uint32_t AbsToF32(uint32_t a) {
    const int32_t h = int32_t(a);
    const int32_t special = 0x7F800000 | ((h & 0x3FF) << 13);
    const int32_t v = h >= 0x7C00 ? special : MagnitudeToF32<F16>(h);
    return uint32_t(v);
  }
  static int32_t Bits(T v) { return int32_t(AbsToF32(v & 0x7FFFu) | (uint32_t(v >> 15) << 31)); }
};

struct OutF32 {
  using T = uint32_t;
  static constexpr int32_t kSignShift = 31;
  static constexpr uint32_t kInf = kF32Inf, kNaN = kF32NaN;
  static T FromF32(int32_t b) { return uint32_t(b); }  // b: a normal fp32, zero or +Inf
};
struct OutBF16 {
  using T = uint16_t;
  static constexpr int32_t kSignShift = 15;
  static constexpr uint32_t kInf = 0x7F80, kNaN = BF16Format().nan_code;
  static T FromF32(int32_t b) {  // unsigned for the same reason as RoundMagnitude
    const uint32_t ub = uint32_t(b);
    return T((ub + 0x7FFFu + ((ub >> 16) & 1u)) >> 16);
  }
};
struct OutF16 {
  using T = uint16_t;
  static constexpr int32_t kSignShift = 15;
  static constexpr uint32_t kInf = 0x7C00, kNaN = F16Format().nan_code;
  static T FromF32(int32_t b) { return T(RoundMagnitude<F16>(b, 0x7C00)); }
};

// ------------------------------------------------------------------------ block formats
// One trait struct per block format: the element format, how a block scale reaches the
// elements (a power of two multiplied in, or an fp32 divisor), and the NaN/Inf codes.
// A new format is one more struct here and one case in the dispatch.
struct MxE4M3 {
  static constexpr int32_t kFormat = kMxfp8E4m3;
  static constexpr int64_t kBlock = 32;  // elements per block along a row (0: no fixed block)
  using E = E4M3;
  static constexpr bool kPow2 = true;
  static bool IsNaN(int32_t mag) { return mag == 0x7F; }
  static bool IsInf(int32_t) { return false; }
};
struct MxE5M2 {
  static constexpr int32_t kFormat = kMxfp8E5m2;
  static constexpr int64_t kBlock = 32;
  using E = E5M2;
  static constexpr bool kPow2 = true;
  static bool IsNaN(int32_t mag) { return mag > 0x7C; }
  static bool IsInf(int32_t mag) { return mag == 0x7C; }
};
struct Mxfp4 {  // OCP MX v1.0 MXFP4: E2M1 (no NaN or Inf codes) with E8M0 scales per 32
  static constexpr int32_t kFormat = kMxfp4;
  static constexpr int64_t kBlock = 32;
  using E = E2M1;
  static constexpr bool kPow2 = true;
  static bool IsNaN(int32_t) { return false; }
  static bool IsInf(int32_t) { return false; }
};
struct Nvfp4 {
  static constexpr int32_t kFormat = kNvfp4;
  static constexpr int64_t kBlock = 16;
  using E = E2M1;
  static constexpr bool kPow2 = false;
  static bool IsNaN(int32_t) { return false; }
  static bool IsInf(int32_t) { return false; }
};
template <int32_t F>
struct Fp8Scaled {  // FP8 blockwise 1x128 / 128x128 and per-tensor: E4M3 with an fp32 scale
  static constexpr int32_t kFormat = F;
  static constexpr int64_t kBlock = F == kFp8PerTensor ? 0 : 128;  // 128x128: a tile row's run
  using E = E4M3;
  static constexpr bool kPow2 = false;
  static bool IsNaN(int32_t mag) { return mag == 0x7F; }
  static bool IsInf(int32_t) { return false; }
};

inline bool NormalF32(uint32_t b) { return b >= 0x00800000u && b < kF32Inf; }

// ComputeBlockScale by integer and float arithmetic where each operation's operands and result
// are normal fp32 (so IEEE RN is the rules' unbounded-exponent RN, FTZ or not); returns 0 where
// the block needs ComputeBlockScale itself (zero, subnormal or special amax, extreme global
// scales). Branch-free, with every value defined in every lane, so a loop over blocks vectorises:
// the scalar rules cost ~10x more than a block's elements for NVFP4's 16-blocks, and per-block
// branches cost MX along K a third of its time (measured; docs/design.md "CPU speed").
//  - MX: e = exponent(amax) - max_k + (round up and significand(amax) > max_m), at least -127;
//  - NVFP4: the E4M3 scale of RN(RN(amax / g) / 6) (nearest even or ceil on the E4M3 grid,
//    saturating); a zero scale (nearest, tiny blocks) is left to ComputeBlockScale;
//  - FP8 blockwise / per-tensor: RN(amax / 448).
template <class Fmt>
inline uint32_t SimpleBlockScale(uint32_t amax, uint32_t round_up, uint32_t g, uint32_t* stored, int32_t* k,
                                 uint32_t* m) {
  if constexpr (Fmt::kPow2) {
    const ElementRule r = ElementRuleOf(Fmt::kFormat);
    int32_t e = int32_t(amax >> 23) - 127 - r.max_k + int32_t(round_up & uint32_t(((amax & 0x7FFFFFu) | 0x800000u) > r.max_m));
    e = e > -kE8M0Bias ? e : -kE8M0Bias;
    *stored = uint32_t(e + kE8M0Bias);
    *k = e;
    *m = 0;
    return uint32_t(NormalF32(amax));
  } else if constexpr (Fmt::kFormat == kNvfp4) {
    const float y = AsFloat(amax) / AsFloat(g);  // RN(amax / g): jax.nn divides by g first
    const uint32_t yb = AsBits(y);
    const float q = y / 6.0f;
    const uint32_t qb = AsBits(q);
    const bool normal_q = qb >= uint32_t(E4M3::kMinNormalBits);
    int32_t up = int32_t((qb + 0xFFFFFu) >> 20) - E4M3::kRebias;  // ceil on the E4M3 grid
    up = up < 0x7E ? up : 0x7E;
    up = up > 0 ? up : 0;  // lanes whose q is not a normal E4M3 value are discarded
    const float t = (normal_q ? 0.0f : q) * 512.0f;  // subnormal steps of 2^-9; exact, t in [0, 8)
    const int32_t ti = int32_t(t > 0.0f && t < 8.0f ? t : 0.0f);
    const int32_t sub = ti + (float(ti) != t && t < 8.0f ? 1 : 0);
    up = normal_q ? up : sub;
    const int32_t nearest = RoundMagnitude<E4M3>(int32_t(qb), 0x7E);  // q normal: exact, subnormals too
    const int32_t code = round_up ? up : nearest;
    const uint32_t sbits = uint32_t(MagnitudeToF32<E4M3>(code));
    *stored = uint32_t(code);
    *k = int32_t(sbits >> 23) - 127;
    *m = (sbits & 0x7FFFFFu) | 0x800000u;
    return uint32_t(NormalF32(amax) & !GlobalScaleInvalid(g) & NormalF32(yb) & NormalF32(qb) & (code != 0));
  } else {
    const uint32_t q = AsBits(AsFloat(amax) / 448.0f);
    *stored = q;
    *k = int32_t(q >> 23) - 127;
    *m = (q & 0x7FFFFFu) | 0x800000u;
    return uint32_t(NormalF32(amax) & (q >= 0x00800000u));
  }
}

template <class Fmt>
inline BlockScale BlockScaleOf(uint32_t amax, int32_t rounding, uint32_t g) {
  BlockScale s{0, false, 0, 0, g};
  if (SimpleBlockScale<Fmt>(amax, rounding == kRoundUp ? 1u : 0u, g, &s.stored, &s.k, &s.m)) return s;
  return ComputeBlockScale(Fmt::kFormat, rounding, amax, g);
}

// Smallest block-scale exponent for which the fast quantize path is exact: below it an fp32
// subnormal input could scale to a non-zero code, which DAZ would lose. NVFP4 divides by g, then
// by s_b: there the bound is on s_b * g (k + gk, both lower bounds of the exponents); a flushed
// RN(x / g) or RN(x / g / s_b) lies below 2^-117, whose code is 0 anyway.
template <class Fmt>
constexpr int32_t kQuantMinScaleK = -125 - Fmt::E::kEmin + Fmt::E::kMbits;

// The global scale's exponent (NVFP4's elements are divided by g first; 0 for other formats).
inline int32_t GlobalK(uint32_t g) { return int32_t((g >> 23) & 0xFFu) - 127; }

// The fast quantize path's per-block value: MX multiplies by 2^-k, FP8 divides by (k, m), NVFP4
// divides by g, then by its block scale (k, m). Returns false where the block must take the
// scalar rules. Split in two so group loops can run them branch-free over many blocks: whether the
// scale's exponent allows the fast path, and the value (defined for any k, used only where allowed).
template <class Fmt>
inline uint32_t QuantFastK(int32_t k, int32_t gk = 0) {
  if constexpr (Fmt::kFormat == kNvfp4) return uint32_t(k + gk >= kQuantMinScaleK<Fmt>);
  return uint32_t(k >= kQuantMinScaleK<Fmt>) & uint32_t(k <= 126);
}
template <class Fmt>
inline float QuantFastParam(int32_t k, uint32_t m) {
  return AsFloat(Fmt::kPow2 ? uint32_t(127 - k) << 23 : EncodeF32(k, m));
}
template <class Fmt>
inline bool QuantFastScale(const BlockScale& s, float* param) {
  if (s.special || !QuantFastK<Fmt>(s.k, GlobalK(s.g)) || s.m == 0) return false;  // m == 0: NVFP4's zero scale
  *param = QuantFastParam<Fmt>(s.k, s.m);
  return true;
}

// One element: fp32 bits (sign in bit 31) -> code, given the block's QuantFastScale value and,
// for NVFP4, the global scale g (RN(RN(x / g) / s_b): jax.nn's order; ignored by other formats).
template <class Fmt>
inline uint8_t QuantizeFast(int32_t bits, float param, float g = 1.0f) {
  using E = typename Fmt::E;
  const float a = AsFloat(uint32_t(bits) & kF32AbsMask);
  const float v = Fmt::kPow2 ? a * param : (Fmt::kFormat == kNvfp4 ? (a / g) / param : a / param);
  const int32_t code = RoundMagnitude<E>(int32_t(AsBits(v)), int32_t(E::kF.max_code));
  return uint8_t(code | ((uint32_t(bits) >> 31) << E::kSignShift));
}

// ------------------------------------------------------------------------ bf16 / fp32 divisor
// Blocks of bf16 input with an fp32 divisor (FP8 blockwise and per-tensor; NVFP4 off its
// threshold path): QuantizeFast's operations element for element, so the same bits, arranged
// for 16-bit input. |x| and the sign are taken on 16-bit lanes; |x| is widened to fp32 by
// interleaving with zeros (|x| << 16 in each 32-bit lane: one unpack per 8 lanes, in the order
// that the narrowing back to 16 bits undoes, so no cross-lane permute); the codes are narrowed
// to 16 bits, get the sign there, and two vectors pack into 32 bytes. The fp32 loop spent more
// instructions widening, moving the sign and narrowing than rounding: FP8_1x128 1.9 -> 1.5 ms
// single thread on AVX2 (measured). n elements, any n: whole 32-element steps, then the rest
// by QuantizeFast. Its rounding is RoundMagnitude's, line for line, on vectors. Not on AVX-512
// CPUs (Bf16DivLoopPays).
template <class Fmt>
inline void QuantizeBf16Div(const uint16_t* x, int64_t n, float p, float g, uint8_t* out);

// Whether QuantizeBf16Div runs instead of the QuantizeFast loop. Not where the AVX-512 clone
// runs: there the compiler's own fp32 loop is 16 lanes wide and narrows with one instruction
// (vpmovdb), it was the measured fastest (docs/design.md "CPU speed", 2026-11-25), and this
// loop's fixed 32-byte vectors were not measured on such a CPU (none was at hand).
inline bool Bf16DivLoopPays() {
#if defined(GPUEXT_CPU_AVX512_CLONE)
  static const bool avx512 = __builtin_cpu_supports("avx512bw");
  return !avx512;
#else
  return true;
#endif
}

template <class Fmt>
inline void QuantizeBf16Div(const uint16_t* x, int64_t n, float p, float g, uint8_t* out) {
  using E = typename Fmt::E;
  typedef uint16_t U16 __attribute__((vector_size(32)));
  typedef uint32_t U32 __attribute__((vector_size(32)));
  typedef int32_t I32 __attribute__((vector_size(32)));
  typedef float F32 __attribute__((vector_size(32)));
  typedef uint8_t B32 __attribute__((vector_size(32)));
  constexpr int32_t drop = 23 - E::kMbits;
  const F32 pv = F32{} + p, gv = F32{} + g, magic = F32{} + AsFloat(E::kMagicBits);
  const U16 zero = {};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    U16 r[2];
    for (int h = 0; h < 2; ++h) {
      U16 v;
      std::memcpy(&v, x + i + 16 * h, 32);
      const U16 a = v & uint16_t(0x7FFF);
      U16 half[2] = {__builtin_shufflevector(zero, a, 0, 16, 1, 17, 2, 18, 3, 19, 8, 24, 9, 25, 10, 26, 11, 27),
                     __builtin_shufflevector(zero, a, 4, 20, 5, 21, 6, 22, 7, 23, 12, 28, 13, 29, 14, 30, 15, 31)};
      for (U16& w : half) {  // RoundMagnitude on |x| / p, 8 fp32 lanes
        const U32 b = (U32)(Fmt::kFormat == kNvfp4 ? ((F32)w / gv) / pv : (F32)w / pv);
        const I32 normal = (I32)((b + ((1u << (drop - 1)) - 1u) + ((b >> drop) & 1u)) >> drop) - E::kRebias;
        const I32 sub = (I32)((F32)b + magic) - E::kMagicBits;
        I32 code = (I32)b >= E::kMinNormalBits ? normal : sub;
        code = code < int32_t(E::kF.max_code) ? code : int32_t(E::kF.max_code);
        w = (U16)code;
      }
      // The low 16 bits of each 32-bit lane (codes are 0..max_code), back in element order.
      const U16 code = __builtin_shufflevector(half[0], half[1], 0, 2, 4, 6, 16, 18, 20, 22, 8, 10, 12, 14, 24, 26, 28, 30);
      r[h] = code | ((v >> 15) << E::kSignShift);
    }
    const B32 b0 = (B32)r[0], b1 = (B32)r[1];
    const B32 bytes = __builtin_shufflevector(b0, b1, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34, 36,
                                              38, 40, 42, 44, 46, 48, 50, 52, 54, 56, 58, 60, 62);
    std::memcpy(out + i, &bytes, 32);
  }
  for (; i < n; ++i) out[i] = QuantizeFast<Fmt>(int32_t(uint32_t(x[i]) << 16), p, g);
}

// ------------------------------------------------------------------------ bf16 x power of two
// MX blocks of bf16 input: x * 2^-k is exact, and where it is a normal number its bf16 bits are
// |x|'s bits minus k << 7. So the element code is a 16-bit integer computation: 16 lanes per
// AVX2 register where the fp32 path has 8 (measured 1.5x on MXFP8). Per lane, the scaled value v:
//  - v >= the element's smallest normal: round the bits (RNE, as RoundMagnitude), saturate;
//  - v <= half the smallest subnormal: code 0 (RNE: a tie goes to the even code 0). This also
//    covers zeros, and bf16 subnormal inputs, whose subtraction gives no value's bits: the fast
//    path's kQuantMinScaleK keeps both their true and their computed v below that bound;
//  - in between (subnormal codes, rare): `slow` is set and the caller recomputes the run
//    with QuantizeFast. Only fast-path blocks get here: every element is finite, |x| <= amax.
template <class E>
struct Bf16Pow2 {
  static constexpr int32_t kDrop = 7 - E::kMbits;
  static constexpr int32_t kMinNormal = (E::kEmin + 127) << 7;
  static constexpr int32_t kZeroAtOrBelow = (E::kEmin - E::kMbits - 1 + 127) << 7;
  static constexpr int32_t kRebias = (127 - E::kF.bias) << E::kMbits;
};

// kshift: the block's k << 7 (|k| <= 126, so it fits 16 bits; so does every v of a fast block).
template <class Fmt>
inline uint8_t QuantizeBf16Pow2(uint16_t bits, int16_t kshift, uint16_t& slow) {
  using E = typename Fmt::E;
  using P = Bf16Pow2<E>;
  const int16_t v = int16_t(int16_t(bits & 0x7FFF) - kshift);
  const uint16_t uv = uint16_t(v);  // unsigned: lanes with v < 0 wrap, and are discarded below
  const uint16_t sum = uint16_t(uv + uint16_t((1 << (P::kDrop - 1)) - 1) + uint16_t((uv >> P::kDrop) & 1));
  int16_t code = int16_t(int16_t(sum >> P::kDrop) - int16_t(P::kRebias));
  int16_t sub = 0;
  if constexpr (E::kMbits == 1) {
    // E2M1 has one subnormal, 2^(emin-1), common in MXFP4 blocks: round onto {0, 2^(emin-1),
    // 2^emin} by comparison. Ties: at 2^(emin-2) to code 0, at 0.75 * 2^emin to code 2 (even).
    constexpr int32_t kMid = ((E::kEmin - 1 + 127) << 7) | 0x40;
    sub = int16_t((v > int16_t(P::kZeroAtOrBelow)) + (v >= int16_t(kMid)));
  } else {
    slow |= uint16_t((v > int16_t(P::kZeroAtOrBelow)) & (v < int16_t(P::kMinNormal)));
  }
  code = v >= int16_t(P::kMinNormal) ? code : sub;
  code = code < int16_t(E::kF.max_code) ? code : int16_t(E::kF.max_code);
  return uint8_t(uint16_t(code) | uint16_t((bits >> 15) << E::kSignShift));
}

// ------------------------------------------------------------------------ NVFP4 by thresholds
// NVFP4 elements without a division per element. The E2M1 code of RN(RN(a / g) / s) (a = |x|,
// g the global scale, s the block's E4M3 scale) is a non-decreasing function of a taking the
// values 0..7, so it is the number of its 7 steps that a passes: code = #{i : a > U_i}, U_i the
// largest input value whose code is at most i. For a block that is 7 compares on integer lanes
// (the bits of |x|: exact under DAZ, subnormals included) instead of 32 divisions and the rounding.
//
// The steps, from E2M1's round-to-nearest-even (ties go to the even code):
//   code >= 1 iff RN(v) > 0.25,  >= 2 iff RN(v) >= 0.75,  >= 3 iff > 1.25,  >= 4 iff >= 1.75,
//   >= 5 iff > 2.5,  >= 6 iff >= 3.5,  >= 7 iff > 5 (6 and above saturate at code 7).
// For t one of those values (exact in fp32, not a power of two, last significand bit 0), fp32's
// own RN turns them into bounds on v itself: RN(v) > t iff v > t + ulp(t)/2 (a tie goes to t,
// the even one), RN(v) >= t iff v >= t - ulp(t)/2 (a tie goes to t). With v = xs / s and
// xs = RN(a / g): step i is xs > D_i or xs >= D_i, D_i = bound_i * s (25 times 4 significant
// bits, exact in double, never an fp32 value: bound_i is an odd 25-bit integer times a power of
// two), so both read xs >= F_i, F_i the smallest fp32 above D_i. Then RN(a / g) >= F_i iff
// a / g > M_i or (a / g == M_i and F_i is even), M_i the midpoint of F_i and the fp32 below it
// (25 bits, odd last bit); a == M_i * g is impossible for an fp32 (let alone bf16) a: M_i * g has
// at least 25 significant bits (exact in double, 49 bits). So step i is a > M_i * g: a > U_i with
// U_i the largest input value below M_i * g. All in double and integer compares: no FTZ/DAZ
// concern. tests/formats/test_formats.py sweeps every bf16 value of a block at the smallest and
// largest divisors the path takes, for both scale roundings, and the float32 / float16 inputs
// around the global scale.
inline constexpr double kNvfp4Bounds[7] = {0.25 + 0x1p-26, 0.75 - 0x1p-25, 1.25 + 0x1p-24, 1.75 - 0x1p-24,
                                           2.5 + 0x1p-23,  3.5 - 0x1p-23,  5.0 + 0x1p-22};

// The largest value of a format below d > 0 (d never a value of it), as bits: subnormals are
// multiples of the smallest one; normals are d's double bits truncated to the format's
// significand and rebiased; past the largest finite value, that one.
inline int16_t Bf16Below(double d) {
  if (d >= 0x1.FEp127) return 0x7F7F;
  if (d < 0x1p-126) return int16_t(d * 0x1p133);  // exact scaling, then floor
  uint64_t b;
  std::memcpy(&b, &d, 8);
  return int16_t((b - (uint64_t(1023 - 127) << 52)) >> 45);
}
inline int16_t F16Below(double d) {
  if (d >= 65504.0) return 0x7BFF;
  if (d < 0x1p-14) return int16_t(d * 0x1p24);
  uint64_t b;
  std::memcpy(&b, &d, 8);
  return int16_t((b - (uint64_t(1023 - 15) << 52)) >> 42);
}
inline int32_t F32Below(double d) {
  if (d >= 0x1.FFFFFEp127) return 0x7F7FFFFF;
  if (d < 0x1p-126) return int32_t(d * 0x1p149);
  uint64_t b;
  std::memcpy(&b, &d, 8);
  return int32_t((b - (uint64_t(1023 - 127) << 52)) >> 29);
}

// M_i * g above: the threshold on |x| of step i for the block scale s and the global scale g.
inline double Nvfp4StepOnX(int i, double s, double g) {
  const double d = kNvfp4Bounds[i] * s;  // in [2^-11, 2240]: a normal fp32 range, no FTZ concern
  float f = float(d);  // RN; d is never an fp32 value, so f != d
  if (double(f) < d) f = std::nextafter(f, std::numeric_limits<float>::infinity());
  const float below = std::nextafter(f, 0.0f);
  return (double(below) + double(f)) / 2 * g;
}

// The thresholds of every block scale one global scale g allows, as a table by the block's stored
// E4M3 scale code: a block costs one row address instead of 7 threshold computations. Row c holds
// U_0..U_6 for s = E4M3(c), as bf16 bits (bf16, for bfloat16 input), float16 bits (f16) and
// fp32 bits (u32, for float32 input and the strided path, where every input widens exactly).
// Used only for blocks with a nonzero scale that SimpleBlockScale computed; rows 0 and 127 (zero
// and NaN scales) are never read. Built once per thread's part and global scale (~10 us).
struct Nvfp4Table {
  uint32_t g = 0;
  bool built = false;
  alignas(16) int16_t bf16[128][8];
  alignas(16) int16_t f16[128][8];
  alignas(32) int32_t u32[128][8];
  alignas(32) int32_t u32t[7][128];  // u32 transposed: threshold i of every code (strided lanes gather it)

  // The row of 16-bit thresholds for 16-bit input In (bfloat16 or float16).
  template <class In>
  const int16_t* Row16(uint32_t code) const {
    return std::is_same_v<In, InF16> ? f16[code & 0x7F] : bf16[code & 0x7F];
  }

  void Build(uint32_t gbits) {
    g = gbits;
    built = true;
    const double gd = double(AsFloat(gbits));
    for (int c = 0; c < 128; ++c) {
      const double s = double(AsFloat(uint32_t(MagnitudeToF32<E4M3>(c))));
      for (int i = 0; i < 7; ++i) {
        const double t = c == 0 || c > 0x7E ? 0.0 : Nvfp4StepOnX(i, s, gd);
        bf16[c][i] = t > 0 ? Bf16Below(t) : int16_t(0);
        f16[c][i] = t > 0 ? F16Below(t) : int16_t(0);
        u32[c][i] = u32t[i][c] = t > 0 ? F32Below(t) : 0;
      }
      bf16[c][7] = f16[c][7] = 0;  // padding: rows of 16 / 32 bytes
      u32[c][7] = 0;
    }
  }
};

// One whole NVFP4 block: 16 bfloat16 or float16 elements (sign bit 15, |x| in the low 15 bits,
// ordered as integers either way) -> their codes, packed (8 bytes, element 2i in the low nibble
// of byte i) or one per byte (16 bytes). GCC vector types: one AVX2 register in the v3 and v4
// clones, two SSE2 registers in the baseline. Valid for finite inputs; u[i] is threshold U_i (a
// Row16 of Nvfp4Table).
template <bool kPacked>
inline void QuantizeNvfp4Block16(const uint16_t* x, const int16_t* u, uint8_t* out) {
  typedef int16_t V16 __attribute__((vector_size(32)));
  typedef uint32_t V8 __attribute__((vector_size(32)));
  typedef uint8_t B32 __attribute__((vector_size(32)));
  V16 v;
  std::memcpy(&v, x, 32);
  const V16 a = v & int16_t(0x7FFF);
  // Each compare is -1 where true: the code is minus their sum.
  V16 code = a > u[0];
  for (int i = 1; i < 7; ++i) code += a > u[i];
  code = -code | ((v >> 15) & int16_t(8));  // the sign bit of E2M1
  B32 b;
  if constexpr (kPacked) {
    V8 w;  // element pairs: 2i in the low half of 32-bit lane i, 2i + 1 in the high half
    std::memcpy(&w, &code, 32);
    w = w | (w >> 12);  // byte 0 of lane i: element 2i | element 2i + 1 << 4
    std::memcpy(&b, &w, 32);
    b = __builtin_shufflevector(b, b, 0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20,
                                24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
    std::memcpy(out, &b, 8);
  } else {
    std::memcpy(&b, &code, 32);  // the low byte of each 16-bit lane
    b = __builtin_shufflevector(b, b, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 0, 2, 4, 6, 8, 10, 12,
                                14, 16, 18, 20, 22, 24, 26, 28, 30);
    std::memcpy(out, &b, 16);
  }
}

// The same block for float32 input: 16 elements on 32-bit lanes (two AVX2 registers), u a u32
// row of Nvfp4Table; codes one per byte into out.
inline void QuantizeNvfp4BlockF32(const uint32_t* x, const int32_t* u, uint8_t* out) {
  int32_t bits[16], code[16];
  std::memcpy(bits, x, 64);
  for (int t = 0; t < 16; ++t) {
    const int32_t a = bits[t] & int32_t(kF32AbsMask);
    int32_t c = 0;
    for (int i = 0; i < 7; ++i) c += a > u[i];
    code[t] = c | ((bits[t] >> 28) & 8);  // the sign bit of E2M1
  }
  for (int t = 0; t < 16; ++t) out[t] = uint8_t(code[t]);
}

// n elements of a strided row with their own thresholds (fp32 bits, threshold-major:
// thr[i * stride + lane]): the strided path's lanes each belong to another block. One pass, the
// seven compares unrolled, so each vector of lanes is loaded once.
template <class In>
inline void QuantizeNvfp4Lanes(const typename In::T* x, const int32_t* thr, int64_t stride, int64_t n,
                               uint8_t* out) {
  const int32_t *t0 = thr, *t1 = thr + stride, *t2 = thr + 2 * stride, *t3 = thr + 3 * stride;
  const int32_t *t4 = thr + 4 * stride, *t5 = thr + 5 * stride, *t6 = thr + 6 * stride;
  for (int64_t l = 0; l < n; ++l) {
    const int32_t b = In::Bits(x[l]);
    const int32_t a = b & int32_t(kF32AbsMask);
    const int32_t c = (a > t0[l]) + (a > t1[l]) + (a > t2[l]) + (a > t3[l]) + (a > t4[l]) + (a > t5[l]) + (a > t6[l]);
    out[l] = uint8_t(c | ((b >> 28) & 8));  // the sign bit of E2M1
  }
}

// The fast dequantize path's per-block multipliers (y = (value * m0) * m1, each product exact
// or rounded once as the rules say). Returns false where the block must take the scalar rules:
// a NaN scale or global scale, or a result that could leave the normal fp32 range at the bottom.
template <class Fmt>
inline bool DequantFastScale(uint32_t scale, uint32_t g, float* m0, float* m1) {
  using E = typename Fmt::E;
  constexpr int32_t min_elem_k = E::kEmin - E::kMbits;  // the smallest subnormal's exponent
  *m0 = 1.0f;  // defined even for blocks that take the scalar rules (their lanes are discarded)
  *m1 = 1.0f;
  if (Fmt::kPow2) {
    if (scale == kE8M0NaN) return false;
    const int32_t e = int32_t(scale) - kE8M0Bias;
    *m0 = AsFloat(uint32_t(e + 127) << 23);
    return e + min_elem_k >= kMinNormalExp;
  }
  if (Fmt::kFormat == kNvfp4) {
    if ((scale & 0x7Fu) == E4M3Format().nan_code || GlobalScaleInvalid(g)) return false;
    const uint32_t sfield = (scale >> 3) & 0xFu;
    const int32_t sk = sfield == 0 ? -9 : int32_t(sfield) - 7;  // a lower bound for subnormal codes
    // The scale's sign rides on m0: data x scale, so a negative (hand-built) scale flips the
    // result's sign, zeros included (DequantizeElement's rule; DequantizeFast applies it).
    *m0 = AsFloat(uint32_t(MagnitudeToF32<E4M3>(int32_t(scale & 0x7Fu))) | ((scale & 0x80u) << 24));
    *m1 = AsFloat(g);
    const int32_t gk = int32_t((g >> 23) & 0xFFu) - 127;
    return (scale & 0x7Fu) == 0 || sk + gk + min_elem_k >= kMinNormalExp;
  }
  const uint32_t a = scale & kF32AbsMask;
  const int32_t k = int32_t(a >> 23) - 127;
  *m0 = AsFloat(scale);  // with its sign, as for NVFP4 above
  return k > -127 && k < 128 && k + min_elem_k >= kMinNormalExp;
}

// One element code -> output bits, given the block's DequantFastScale multipliers.
template <class Fmt, class Out>
inline typename Out::T DequantizeFast(int32_t code, float m0, float m1) {
  using E = typename Fmt::E;
  const int32_t mag = code & E::kMagMask;
  const uint32_t sign = uint32_t(code >> E::kSignShift) & 1u;
  const float v = AsFloat(uint32_t(MagnitudeToF32<E>(mag)));
  const float y = Fmt::kFormat == kNvfp4 ? (v * m0) * m1 : v * m0;
  // A negative scale makes y negative (a zero element -0): fold that sign into the code's.
  const uint32_t yb = AsBits(y);
  const uint32_t s = sign ^ (yb >> 31);
  uint32_t r = uint32_t(Out::FromF32(int32_t(yb & kF32AbsMask))) | (s << Out::kSignShift);
  r = Fmt::IsInf(mag) ? (Out::kInf | (sign << Out::kSignShift)) : r;
  r = Fmt::IsNaN(mag) ? Out::kNaN : r;
  return typename Out::T(r);
}

}  // namespace gpuext::formats::cpu
