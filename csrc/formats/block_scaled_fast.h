// Per-element fast paths of the block-scaled rules for the CUDA kernels (docs/design.md, "Quantize
// at memory speed on Hopper"): the same bits as block_scaled_math.h's scalar rules wherever a block
// passes its fast-path test, with no division and no per-element decode.
//
// Every function is GPUEXT_HD. On the GPU (sm_89+) two steps use hardware conversions that are IEEE
// round-to-nearest-even by the PTX ISA: fp32 -> E4M3/E5M2 with saturation (`cvt.rn.satfinite`), and
// E4M3 -> f16 (exact). Everywhere else (the host, sm_80) their software equivalents below run, so
// tests/formats/test_fast_math.py can check all of this header with g++ against the scalar rules.
//
// No FTZ: the fp32 operations here must keep subnormals (nvcc's default; the SASS test checks the
// kernels have no .FTZ arithmetic). The host check runs without FTZ/DAZ too.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "csrc/formats/block_scaled_math.h"

namespace gpuext::formats::fast {

// Compile-time twins of block_scaled_math.h's format predicates (for `if constexpr`).
GPUEXT_HD constexpr bool kMx(int32_t f) { return f == kMxfp8E4m3 || f == kMxfp8E5m2 || f == kMxfp4; }
GPUEXT_HD constexpr bool kFp4(int32_t f) { return f == kNvfp4 || f == kMxfp4; }
GPUEXT_HD constexpr bool kF32Scale(int32_t f) {
  return f == kFp8Blockwise1x128 || f == kFp8Blockwise128x128 || f == kFp8PerTensor;
}

GPUEXT_HD float FmaRn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

GPUEXT_HD float AddRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

GPUEXT_HD float RcpRn(float a) {
#if defined(__CUDA_ARCH__)
  return __frcp_rn(a);
#else
  return 1.0f / a;
#endif
}

GPUEXT_HD uint64_t DoubleBits(double d) {
#if defined(__CUDA_ARCH__)
  return uint64_t(__double_as_longlong(d));
#else
  uint64_t b;
  std::memcpy(&b, &d, 8);
  return b;
#endif
}

// ------------------------------------------------------------------------ element rounding
// |v| (fp32 bits, finite or not NaN) -> the code of element format (mbits, emin = 1 - bias), round to
// nearest even, saturating at max_code. Normal results round on the integer bits; results below
// the element's smallest normal round through `v + magic` (magic: the power of two whose ulp is
// the element's subnormal step), an IEEE sum of normal numbers. The CPU handler's RoundMagnitude.
template <int kMbits, int kEmin, uint32_t kMaxCode>
GPUEXT_HD uint32_t RoundMagnitudeSat(uint32_t b) {
  constexpr int drop = 23 - kMbits;
  constexpr uint32_t min_normal = uint32_t(kEmin + 127) << 23;
  constexpr uint32_t magic = uint32_t(kEmin - kMbits + 23 + 127) << 23;
  constexpr uint32_t rebias = uint32_t(127 - (1 - kEmin)) << kMbits;  // bias = 1 - emin
  const uint32_t normal = ((b + ((1u << (drop - 1)) - 1u) + ((b >> drop) & 1u)) >> drop) - rebias;
  const uint32_t sub = FloatToBits(AddRn(BitsToFloat(b), BitsToFloat(magic))) - magic;
  const uint32_t code = b >= min_normal ? normal : sub;
  return code < kMaxCode ? code : kMaxCode;
}

GPUEXT_HD uint32_t E4M3Sat(uint32_t abs_bits) { return RoundMagnitudeSat<3, -6, 0x7E>(abs_bits); }
GPUEXT_HD uint32_t E5M2Sat(uint32_t abs_bits) { return RoundMagnitudeSat<2, -14, 0x7B>(abs_bits); }

// Two signed fp32 values -> their E4M3 (kE5m2: E5M2) codes, lo in bits 0-7, hi in bits 8-15: RN
// even, saturating at the largest finite code, signed zero kept. Inputs are finite.
template <bool kE5m2>
GPUEXT_HD uint32_t Fp8Pair(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  unsigned short r;
  if constexpr (kE5m2) {
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  }
  return r;
#else
  const uint32_t a = FloatToBits(lo), b = FloatToBits(hi);
  const uint32_t ca = kE5m2 ? E5M2Sat(a & kF32AbsMask) : E4M3Sat(a & kF32AbsMask);
  const uint32_t cb = kE5m2 ? E5M2Sat(b & kF32AbsMask) : E4M3Sat(b & kF32AbsMask);
  return (ca | ((a >> 31) << 7)) | ((cb | ((b >> 31) << 7)) << 8);
#endif
}

// v >= 0 finite (fp32) -> its E2M1 code 0..7, RN even, saturating at 6 (code 7). E2M1's step is 0.5
// below 2, 1 below 4, 2 above; with j = clamp(exponent(v), 0, 2), w = v 2^(1-j) counts those steps
// and w + 1.5 * 2^23 (an IEEE sum: ulp 1) rounds it to an integer n, ties to even. The code is
// n + 2j: the code's parity is n's, so RN-even on n is RN-even on the code. A v below 2^-126
// (subnormal or zero) gets j = 0 and a w below 2^-125 whose n is 0.
GPUEXT_HD uint32_t E2M1Sat(float v) {
  const uint32_t b = FloatToBits(v);
  uint32_t e = b & 0x7F800000u;
  e = e < (127u << 23) ? (127u << 23) : (e > (129u << 23) ? (129u << 23) : e);  // (127 + j) << 23
  const float w = BitsToFloat(b + (128u << 23) - e);                                   // v 2^(1-j)
  const uint32_t n = FloatToBits(AddRn(w, 12582912.0f)) - 0x4B400000u;                // 1.5 * 2^23
  const uint32_t code = n + ((e >> 22) - (127u << 1));
  return code < 7u ? code : 7u;
}

// ------------------------------------------------------------------------ division by a block scale
// RN(a / s) for a >= 0 and s > 0 with y = RN(1 / s): q = RN(a y) is within an ulp of a / s,
// r = a - q s is exact (one FMA), and RN(q + r y) is the correctly rounded quotient (Markstein's
// theorem), provided nothing underflows. FP8 scales s >= 2^kFp8FastMinK keep every quantity normal
// for the elements that matter (a / s >= 2^-11; smaller quotients give code 0 however they round).
GPUEXT_HD float DivByScale(float a, float s, float y) {
  const float q = MulRn(a, y);
  const float r = FmaRn(-q, s, a);
  return FmaRn(r, y, q);
}
constexpr int32_t kFp8FastMinK = -91;

// ------------------------------------------------------------------------ per block
// What the element loop needs from a block: computed once per block from its BlockScale.
//  - MX: p0 = 2^-k (the elements are x * p0 exactly);
//  - FP8 blockwise / per-tensor: p0 = s, p1 = RN(1 / s); `fast` false below kFp8FastMinK;
//  - NVFP4: code = the E4M3 block scale's code (the threshold table's row).
// `special` (NaN/Inf block or bad global scale): every element is 0.
struct ElemParams {
  float p0 = 1.0f, p1 = 1.0f;
  int32_t k = 0;
  uint32_t m = 0;
  uint32_t code = 0;
  bool special = false, fast = true;
};

template <int32_t kFmt>
GPUEXT_HD ElemParams ParamsOf(const BlockScale& s) {
  ElemParams p;
  p.special = s.special;
  p.k = s.k;
  p.m = s.m;
  p.code = s.stored & 0x7Fu;
  if constexpr (kMx(kFmt)) {
    p.p0 = BitsToFloat(uint32_t(127 - s.k) << 23);  // |k| <= 126 for every finite amax
  } else if constexpr (kF32Scale(kFmt)) {
    p.p0 = BitsToFloat(EncodeF32(s.k, s.m));
    p.p1 = RcpRn(p.p0);
    p.fast = s.k >= kFp8FastMinK;
  }
  return p;
}

// ------------------------------------------------------------------------ NVFP4 thresholds
// The 7 E2M1 rounding steps as bounds on RN_fp32(v) (ties go to the even code): code >= i + 1 iff
// RN(v) > 0.25, >= 0.75, > 1.25, >= 1.75, > 2.5, >= 3.5, > 5; as exact bounds on v itself: t +- ulp(t)/2.
// block_scaled_cpu_kernels.h (kNvfp4Bounds) derives why a block's element code is the number of
// thresholds U_i = F32Below(M_i g) that |x|'s bits exceed; this is the same computation in HD form.
GPUEXT_HD double Nvfp4Bound(int i) {
  switch (i) {
    case 0: return 0.25 + 0x1p-26;
    case 1: return 0.75 - 0x1p-25;
    case 2: return 1.25 + 0x1p-24;
    case 3: return 1.75 - 0x1p-24;
    case 4: return 2.5 + 0x1p-23;
    case 5: return 3.5 - 0x1p-23;
    default: return 5.0 + 0x1p-22;
  }
}

// The largest fp32 bit pattern below d > 0 (d never an fp32 value).
GPUEXT_HD uint32_t F32BitsBelow(double d) {
  if (d >= 0x1.FFFFFEp127) return 0x7F7FFFFFu;
  if (d < 0x1p-126) return uint32_t(d * 0x1p149);  // exact scaling, then floor
  return uint32_t((DoubleBits(d) - (uint64_t(1023 - 127) << 52)) >> 29);
}

// Threshold i for the block scale s (a nonzero E4M3 value) and global scale g (a valid one).
GPUEXT_HD uint32_t Nvfp4Threshold(int i, double s, double g) {
  const double d = Nvfp4Bound(i) * s;  // in [2^-11, 2240]: a normal fp32 range, never an fp32 value
  uint32_t f = FloatToBits(float(d));  // RN
  if (double(BitsToFloat(f)) < d) ++f;  // the smallest fp32 above d
  const double mid = (double(BitsToFloat(f - 1)) + double(BitsToFloat(f))) / 2;  // exact (25 bits)
  return F32BitsBelow(mid * g);  // exact (25 x 24 bits)
}

// Row `code` of a g's table: U_0..U_6 (a zero scale: all 0, so every nonzero |x| saturates, as x / 0).
GPUEXT_HD uint32_t Nvfp4TableEntry(uint32_t code, int i, uint32_t g_bits) {
  if (code == 0 || code > 0x7E) return 0;
  const double s = double(BitsToFloat(EncodeF32(Decode(code, E4M3Format()).k, Decode(code, E4M3Format()).m)));
  return Nvfp4Threshold(i, s, double(BitsToFloat(g_bits)));
}

// |x| bits -> the number of thresholds it exceeds: the NVFP4 element code's magnitude. Each
// threshold and |x| are below 2^31, so U - a is negative exactly when a > U.
GPUEXT_HD uint32_t Nvfp4Count(uint32_t a, const uint32_t* u) {
  uint32_t c = 0;
#pragma unroll
  for (int i = 0; i < 7; ++i) c += (u[i] - a) >> 31;
  return c;
}

// ------------------------------------------------------------------------ NVFP4, two 16-bit elements at once
// bf16 / f16 input (docs/design.md, "Round 4: NVFP4 on packed 16-bit pairs"). |x| exceeds a threshold
// U (fp32 bits) iff x's own 15 magnitude bits h exceed T = the largest 16-bit pattern whose fp32 bits
// are <= U (16-bit -> fp32 is monotone on magnitudes): for bf16 T = U >> 16, for f16 the bits of U's
// value rounded toward zero to f16 (at most 65504). Each table word holds 0x8000 | T in both halves;
// then one 32-bit subtraction compares both elements of a word: (0x8000 + T) - h lies in [1, 0xFF7F],
// so no borrow crosses the halves, and bit 15 (31) stays set iff h <= T.
GPUEXT_HD uint32_t Nvfp4Threshold16(uint32_t u, bool f16) {
  if (!f16) return u >> 16;
  const int32_t e = int32_t(u >> 23) - 127;  // u: a finite fp32 >= 0
  if (e >= 16) return 0x7BFFu;               // beyond 65504: every finite f16
  if (e >= -14) return uint32_t((e + 15) << 10) | ((u >> 13) & 0x3FFu);  // normal: truncate the significand
  return uint32_t(BitsToFloat(u) * 16777216.0f);  // subnormal f16 steps of 2^-24: exact scaling, then floor
}

// A table word of 16-bit input: threshold U's T in both halves, with the guard bit.
GPUEXT_HD uint32_t Nvfp4PackedThreshold(uint32_t u, bool f16) { return (0x8000u | Nvfp4Threshold16(u, f16)) * 0x10001u; }

// Two 16-bit elements (x2: element 0 in the low half) against packed thresholds w[0..6] (each half
// non-decreasing in i) -> the two E2M1 codes, sign in bit 3: element 0's in bits 0-3, element 1's in
// bits 16-19. n_i keeps bit 15 (31) where the element does NOT exceed threshold i; the thresholds are
// sorted, so the bits e_i = ~n_i form a thermometer code (e_0 >= e_1 >= ... >= e_6) whose count is
// 4 e_3 + 2 (e_1 !e_3 | e_5) + (e_0 !e_1 | e_2 !e_3 | e_4 !e_5 | e_6): ~23 instructions a pair, where
// the fp32 thresholds took ~19.5 an element (docs/design.md, Round 4).
GPUEXT_HD uint32_t Nvfp4PairCodes16(uint32_t x2, const uint32_t* w) {
  const uint32_t h = x2 & 0x7FFF7FFFu;
  const uint32_t n1 = w[1] - h, n3 = w[3] - h, n5 = w[5] - h;
  const uint32_t b2 = ~n3;
  const uint32_t b1 = (n3 & ~n1) | ~n5;
  const uint32_t b0 = (n1 & ~(w[0] - h)) | (n3 & ~(w[2] - h)) | (n5 & ~(w[4] - h)) | ~(w[6] - h);
  constexpr uint32_t m = 0x80008000u;
  return ((b0 & m) >> 15) | ((b1 & m) >> 14) | ((b2 & m) >> 13) | ((x2 & m) >> 12);
}

// ------------------------------------------------------------------------ one element, fast path
// fp32 bits of x -> its code in block format kFmt (sign included), for a non-special block whose
// params are `fast` (NVFP4: `u` is the block's threshold row). The scalar QuantizeElement's bits.
template <int32_t kFmt>
GPUEXT_HD uint32_t QuantizeFastElement(uint32_t x, const ElemParams& p, const uint32_t* u) {
  const uint32_t sign = x >> 31, a = x & kF32AbsMask;
  if constexpr (kFmt == kMxfp4) {
    return E2M1Sat(MulRn(BitsToFloat(a), p.p0)) | (sign << 3);
  } else if constexpr (kFmt == kNvfp4) {
    return Nvfp4Count(a, u) | (sign << 3);
  } else if constexpr (kFmt == kMxfp8E4m3 || kFmt == kMxfp8E5m2) {
    return Fp8Pair<kFmt == kMxfp8E5m2>(MulRn(BitsToFloat(x), p.p0), 0.0f) & 0xFFu;
  } else {
    const float v = DivByScale(BitsToFloat(a), p.p0, p.p1);
    return Fp8Pair<false>(BitsToFloat(FloatToBits(v) | (sign << 31)), 0.0f) & 0xFFu;
  }
}

// Two elements at once for the FP8 element formats (one hardware conversion); lo in bits 0-7.
template <int32_t kFmt>
GPUEXT_HD uint32_t QuantizeFastPair(uint32_t x0, uint32_t x1, const ElemParams& p0, const ElemParams& p1) {
  if constexpr (kFmt == kMxfp8E4m3 || kFmt == kMxfp8E5m2) {
    return Fp8Pair<kFmt == kMxfp8E5m2>(MulRn(BitsToFloat(x0), p0.p0), MulRn(BitsToFloat(x1), p1.p0));
  } else {
    const float v0 = DivByScale(BitsToFloat(x0 & kF32AbsMask), p0.p0, p0.p1);
    const float v1 = DivByScale(BitsToFloat(x1 & kF32AbsMask), p1.p0, p1.p1);
    return Fp8Pair<false>(BitsToFloat(FloatToBits(v0) | (x0 & 0x80000000u)),
                          BitsToFloat(FloatToBits(v1) | (x1 & 0x80000000u)));
  }
}

// The scalar rule for an element of a block off the fast path: out of line on the GPU (rare blocks;
// inlined at every element it would bloat the kernels and their register allocation). Only FP8
// blocks leave the fast path (MX and NVFP4 never do): their divisor is p0, exactly.
#if defined(__CUDA_ARCH__)
#define GPUEXT_COLD __host__ __device__ __noinline__
#elif defined(__CUDACC__)
#define GPUEXT_COLD __host__ __device__ inline
#else
#define GPUEXT_COLD inline
#endif
template <int32_t kFmt>
GPUEXT_COLD uint32_t QuantizeSlow(uint32_t x, float p0, uint32_t g_bits) {
  const Unpacked d = Decode(FloatToBits(p0), F32Format());
  BlockScale s{0, false, d.k, d.m, g_bits};
  return QuantizeElement(kFmt, s, x);
}

// Any element of a block: the fast path where its params allow, else the scalar rule.
template <int32_t kFmt>
GPUEXT_HD uint32_t QuantizeAny(uint32_t x, const ElemParams& p, const uint32_t* u, uint32_t g_bits) {
  if (p.special) return 0;
  if (p.fast) return QuantizeFastElement<kFmt>(x, p, u);
  return QuantizeSlow<kFmt>(x, p.p0, g_bits);
}

// The scalar dequantize rule, out of line on the GPU (NaN/Inf codes, blocks off the fast path).
template <int32_t kFmt>
GPUEXT_COLD uint32_t DequantizeSlow(uint32_t code, uint32_t scale, uint32_t g, BitFormat out) {
  return DequantizeElement(kFmt, code, scale, g, out);
}

// ------------------------------------------------------------------------ dequantize
// An element code's magnitude -> its exact fp32 value (E4M3 / E5M2 / E2M1; zero and subnormals
// included): normal codes by shifting the bits, subnormal ones by `magic + mag - magic` (IEEE, exact).
template <int kMbits, int kEmin>
GPUEXT_HD float CodeMagnitudeValue(uint32_t mag) {
  constexpr uint32_t magic = uint32_t(kEmin - kMbits + 23 + 127) << 23;
  constexpr uint32_t bias = uint32_t(1 - kEmin);
  const uint32_t normal = (mag << (23 - kMbits)) + ((127u - bias) << 23);
  const float sub = AddRn(BitsToFloat(magic + mag), -BitsToFloat(magic));
  return mag >= (1u << kMbits) ? BitsToFloat(normal) : sub;
}

// The fast dequantize path's per-block multipliers (y = (value * m0) * m1 rounded once to the output,
// each product exact or rounded as the rule rounds it): false where the block takes the scalar rule (a
// NaN scale or global scale, or a product that could leave the normal fp32 range at the bottom). The
// CPU handler's DequantFastScale. m0 carries the scale's sign (a hand-built negative scale).
template <int32_t kFmt>
GPUEXT_HD bool DequantParams(uint32_t scale, uint32_t g, float* m0, float* m1) {
  const ElementRule r = ElementRuleOf(kFmt);
  const int32_t min_elem_k = r.elem.emin() - r.elem.mbits;  // the smallest subnormal's exponent
  *m0 = 1.0f;
  *m1 = 1.0f;
  if constexpr (kMx(kFmt)) {
    if (scale == kE8M0NaN) return false;
    const int32_t e = int32_t(scale) - kE8M0Bias;
    *m0 = BitsToFloat(uint32_t(e + 127) << 23);
    return e + min_elem_k >= kMinNormalExp;
  } else if constexpr (kFmt == kNvfp4) {
    if ((scale & 0x7Fu) == E4M3Format().nan_code || GlobalScaleInvalid(g)) return false;
    const uint32_t sfield = (scale >> 3) & 0xFu;
    const int32_t sk = sfield == 0 ? -9 : int32_t(sfield) - 7;  // a lower bound for subnormal codes
    *m0 = CodeMagnitudeValue<3, -6>(scale & 0x7Fu);
    *m0 = BitsToFloat(FloatToBits(*m0) | ((scale & 0x80u) << 24));
    *m1 = BitsToFloat(g);
    const int32_t gk = int32_t((g >> 23) & 0xFFu) - 127;
    return (scale & 0x7Fu) == 0 || sk + gk + min_elem_k >= kMinNormalExp;
  } else {
    const uint32_t a = scale & kF32AbsMask;
    const int32_t k = int32_t(a >> 23) - 127;
    *m0 = BitsToFloat(scale);
    return k > -127 && k < 128 && k + min_elem_k >= kMinNormalExp;
  }
}

// One code's exact value (signed; finite codes only) for block format kFmt.
template <int32_t kFmt>
GPUEXT_HD float CodeValue(uint32_t code) {
  if constexpr (kFp4(kFmt)) {
    const float v = CodeMagnitudeValue<1, 0>(code & 7u);
    return BitsToFloat(FloatToBits(v) | ((code & 8u) << 28));
  } else if constexpr (kFmt == kMxfp8E5m2) {
    const float v = CodeMagnitudeValue<2, -14>(code & 0x7Fu);
    return BitsToFloat(FloatToBits(v) | ((code & 0x80u) << 24));
  } else {
    const float v = CodeMagnitudeValue<3, -6>(code & 0x7Fu);
    return BitsToFloat(FloatToBits(v) | ((code & 0x80u) << 24));
  }
}

// fp32 -> output bits (bf16 / f16 / f32) rounded once to nearest even, overflow to Inf: the
// rule's RoundTo(out) of an fp32 value. The CUDA kernels use the paired hardware conversions.
GPUEXT_HD uint32_t RoundF32To(float y, FloatType out) {
  const uint32_t b = FloatToBits(y);
  if (out == FloatType::kF32) return b;
  const Unpacked u = Decode(b & kF32AbsMask, F32Format());
  if ((b & kF32AbsMask) >= kF32Inf) return (b >> 31) << 15 | (out == FloatType::kBF16 ? 0x7F80u : 0x7C00u);
  return RoundTo(int32_t(b >> 31), u.k, u.m, out == FloatType::kBF16 ? BF16Format() : F16Format());
}

// Dequantize one element on the fast path: y = (value * m0) [* m1 for NVFP4], as the rule.
template <int32_t kFmt>
GPUEXT_HD float DequantFastValue(uint32_t code, float m0, float m1) {
  const float y = MulRn(CodeValue<kFmt>(code), m0);
  return kFmt == kNvfp4 ? MulRn(y, m1) : y;
}

// ------------------------------------------------------------------------ warp-contiguous staging
// The row kernels give a thread V contiguous elements (its blocks' amax needs them together), W
// 16-byte pieces of input. Loading them as they lie puts each load instruction's 32 lanes 16 W bytes
// apart: every 32-byte sector is half read by one instruction and half by the next (round 2 of issue
// 35, docs/design.md). So a warp loads its 32 W pieces warp-contiguously instead (load j of lane l is
// piece 32 j + l: 512 contiguous bytes per instruction), writes them to shared memory, and each lane
// reads back pieces l W + i. Slot of piece p: p with its low bits XORed by (p / 8) mod W, so that both
// the writes and the reads of each quarter-warp (8 lanes x 16 bytes, one shared-memory wavefront)
// hit 8 distinct 16-byte bank groups (tests/formats/test_quantize_sass.py checks every W on the host).
template <int W>
GPUEXT_HD constexpr int StageSlot(int p) {
  static_assert(W == 1 || W == 2 || W == 4 || W == 8, "W: 16-byte pieces per thread, a power of two <= 8");
  return p ^ ((p >> 3) & (W - 1));
}

// Whether any of 4 packed codes is a NaN or Inf code (those take the scalar rule).
template <int32_t kFmt>
GPUEXT_HD bool AnySpecialCode4(uint32_t w) {
  const uint32_t t = w & 0x7F7F7F7Fu;
  if constexpr (kFmt == kMxfp8E5m2) return ((t + 0x04040404u) & 0x80808080u) != 0;  // magnitude >= 0x7C
  if constexpr (kFp4(kFmt)) return false;
  return ((t + 0x01010101u) & 0x80808080u) != 0;  // magnitude == 0x7F
}

}  // namespace gpuext::formats::fast
