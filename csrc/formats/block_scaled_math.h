// The block-scaled format rules (docs/formats.md) on integer bit patterns, shared by the CPU
// handler (g++) and the CUDA kernels (nvcc): one definition, so the two cannot drift apart.
// It mirrors jax_gpuext/formats/reference.py function for function.
//
// Why integers: XLA's CPU runtime runs with FTZ/DAZ, so float max/multiply/divide lose
// subnormals. The only float operations here divide or multiply two significands in [1, 2):
// operands and result are normal, and IEEE fp32 round-to-nearest-even gives the same bits on
// every conforming unit (CUDA: __fdiv_rn / __fmul_rn, never contracted into an FMA).
// A value in flight is (sign, k, m): (-1)^sign * m * 2^(k - 23), m in [2^23, 2^24), m == 0 is zero.
#pragma once

#include <cstdint>
#include <cstring>

#include "csrc/common/host_device.h"

namespace gpuext::formats {

// Values of the `format` attribute (jax_gpuext/formats.py BlockFormat.code).
// kFp8PerTensor is the FP8 blockwise rule with the whole tensor as the block.
enum Format : int32_t {
  kMxfp8E4m3 = 0,
  kMxfp8E5m2 = 1,
  kNvfp4 = 2,
  kFp8Blockwise1x128 = 3,
  kFp8Blockwise128x128 = 4,
  kFp8PerTensor = 5,
  kMxfp4 = 6,  // OCP MX v1.0 MXFP4: E2M1 elements, E8M0 scale per 32, packed like NVFP4
};
constexpr int32_t kLastFormat = kMxfp4;
// Scale rounding (the `scale_rounding` attribute): kRoundUp for every format; kRoundOcp (OCP MX
// v1.0's floor) for MX formats; kRoundNearest (round to nearest even, jax.nn's and TE's) for NVFP4.
enum ScaleRounding : int32_t { kRoundUp = 0, kRoundOcp = 1, kRoundNearest = 2 };
enum class FloatType { kF32, kBF16, kF16 };

constexpr uint32_t kF32AbsMask = 0x7FFFFFFFu, kF32Inf = 0x7F800000u, kF32NaN = 0x7FC00000u, kF32One = 0x3F800000u;
constexpr int32_t kMinNormalExp = -126;
constexpr uint32_t kE8M0NaN = 0xFF, kE4M3One = 0x38;
constexpr int32_t kE8M0Bias = 127;

struct BitFormat {
  int32_t ebits, mbits, bias;
  uint32_t max_code;  // largest finite magnitude code
  bool has_inf;
  uint32_t nan_code;
  GPUEXT_HD int32_t sign_shift() const { return ebits + mbits; }
  GPUEXT_HD int32_t emin() const { return 1 - bias; }
  GPUEXT_HD int32_t emax() const { return int32_t(max_code >> mbits) - bias; }
};

// Functions, not constexpr globals: device code cannot odr-use host globals.
GPUEXT_HD constexpr BitFormat E4M3Format() { return BitFormat{4, 3, 7, 0x7E, false, 0x7F}; }
GPUEXT_HD constexpr BitFormat E5M2Format() { return BitFormat{5, 2, 15, 0x7B, true, 0x7F}; }
GPUEXT_HD constexpr BitFormat E2M1Format() { return BitFormat{2, 1, 1, 0x7, false, 0}; }
GPUEXT_HD constexpr BitFormat F32Format() { return BitFormat{8, 23, 127, 0x7F7FFFFF, true, kF32NaN}; }
GPUEXT_HD constexpr BitFormat BF16Format() { return BitFormat{8, 7, 127, 0x7F7F, true, 0x7FC0}; }
GPUEXT_HD constexpr BitFormat F16Format() { return BitFormat{5, 10, 15, 0x7BFF, true, 0x7E00}; }

struct Unpacked {
  int32_t sign, k;
  uint32_t m;
};

GPUEXT_HD int32_t Clz32(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __clz(x);
#else
  return x ? __builtin_clz(x) : 32;
#endif
}

GPUEXT_HD float BitsToFloat(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float f;
  std::memcpy(&f, &b, 4);
  return f;
#endif
}

GPUEXT_HD uint32_t FloatToBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
#endif
}

GPUEXT_HD float DivRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

GPUEXT_HD float MulRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

// Finite code -> (sign, k, m); zero gives m == 0. Callers handle Inf/NaN codes.
GPUEXT_HD Unpacked Decode(uint32_t code, BitFormat f) {
  Unpacked u;
  u.sign = int32_t((code >> f.sign_shift()) & 1u);
  const int32_t e = int32_t((code >> f.mbits) & ((1u << f.ebits) - 1u));
  const uint32_t raw = (code & ((1u << f.mbits) - 1u)) << (23 - f.mbits);
  if (e == 0) {
    const int32_t norm = raw == 0 ? 0 : Clz32(raw) - 8;
    u.m = raw << norm;
    u.k = f.emin() - norm;
  } else {
    u.m = raw | (1u << 23);
    u.k = e - f.bias;
  }
  return u;
}

// (sign, k, m) -> code of f, rounding to nearest even or up (ceil of the magnitude).
// Subnormals of f are exact; overflow saturates or becomes Inf (formats without Inf saturate).
GPUEXT_HD uint32_t RoundTo(int32_t sign, int32_t k, uint32_t m, BitFormat f, bool round_up = false,
                           bool saturate = false) {
  if (m == 0) return uint32_t(sign) << f.sign_shift();
  int32_t kk = k > f.emax() + 1 ? f.emax() + 1 : (k < -1000 ? -1000 : k);
  int32_t shift = (23 - f.mbits) + (f.emin() - kk > 0 ? f.emin() - kk : 0);
  if (shift > 25) shift = 25;  // m < 2^24: a shift of 25 leaves less than half an ulp
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = (1u << shift) >> 1;
  const bool bump = round_up ? rem != 0 : (shift > 0 && (rem > half || (rem == half && (q & 1u))));
  q += bump ? 1u : 0u;
  const int32_t exp_field = kk + f.bias - 1 > 0 ? kk + f.bias - 1 : 0;
  uint32_t code = (uint32_t(exp_field) << f.mbits) + q;
  const uint32_t limit = (saturate || !f.has_inf) ? f.max_code : f.max_code + 1;
  if (code > limit) code = limit;
  return code | (uint32_t(sign) << f.sign_shift());
}

GPUEXT_HD float SignificandF32(uint32_t m) { return BitsToFloat((m & 0x7FFFFFu) | kF32One); }

// RN_fp32(a / b) and RN_fp32(a * b) with an unbounded exponent; a, b nonzero.
GPUEXT_HD Unpacked Divide(int32_t ka, uint32_t ma, int32_t kb, uint32_t mb) {
  Unpacked q = Decode(FloatToBits(DivRn(SignificandF32(ma), SignificandF32(mb))), F32Format());
  q.k += ka - kb;
  return q;
}

GPUEXT_HD Unpacked Multiply(int32_t ka, uint32_t ma, int32_t kb, uint32_t mb) {
  Unpacked p = Decode(FloatToBits(MulRn(SignificandF32(ma), SignificandF32(mb))), F32Format());
  p.k += ka + kb;
  return p;
}

GPUEXT_HD uint32_t EncodeF32(int32_t k, uint32_t m) { return (uint32_t(k + 127) << 23) | (m & 0x7FFFFFu); }

// float32 / bfloat16 / float16 input bits -> fp32 bits, exactly (subnormals included).
GPUEXT_HD uint32_t HalfToF32Bits(uint32_t h) {
  const uint32_t sign = (h >> 15) << 31;
  if ((h & 0x7C00u) == 0x7C00u) return sign | kF32Inf | ((h & 0x3FFu) << 13);
  const Unpacked u = Decode(h, F16Format());
  return u.m == 0 ? sign : sign | EncodeF32(u.k, u.m);
}

// ---------------------------------------------------------------------------- per format
struct ElementRule {
  BitFormat elem;
  uint32_t max_m;  // significand of the largest element (448 = 1.75 * 2^8, 6 = 1.5 * 2^2)
  int32_t max_k;
};

GPUEXT_HD ElementRule ElementRuleOf(int32_t format) {
  switch (format) {
    case kMxfp8E5m2: return {E5M2Format(), 0xE00000u, 15};
    case kNvfp4:
    case kMxfp4: return {E2M1Format(), 0xC00000u, 2};
    default: return {E4M3Format(), 0xE00000u, 8};
  }
}

GPUEXT_HD bool IsMx(int32_t format) { return format == kMxfp8E4m3 || format == kMxfp8E5m2 || format == kMxfp4; }
GPUEXT_HD bool HasF32Scale(int32_t format) {
  return format == kFp8Blockwise1x128 || format == kFp8Blockwise128x128 || format == kFp8PerTensor;
}
// E2M1 elements (NVFP4, MXFP4): 4-bit codes, the only formats that FP4 packing applies to.
GPUEXT_HD bool IsFp4(int32_t format) { return format == kNvfp4 || format == kMxfp4; }

// g must be a positive normal fp32; zero, subnormal (lost under FTZ), negative, Inf, NaN are not.
GPUEXT_HD bool GlobalScaleInvalid(uint32_t g) {
  const uint32_t e = (g >> 23) & 0xFFu;
  return (g >> 31) != 0 || e == 0 || e == 0xFF;
}

// Everything element quantization needs to know about one block.
struct BlockScale {
  uint32_t stored;  // the scale as stored: E8M0 / E4M3 code or fp32 bits
  bool special;     // NaN/Inf in the block (or a bad global scale): elements are 0, scale NaN
  int32_t k;        // MX: the power-of-two exponent; FP8: the fp32 divisor (k, m); NVFP4: the
  uint32_t m;       //   E4M3 block scale's value (m == 0: the scale is 0)
  uint32_t g = kF32One;  // NVFP4: the global scale's fp32 bits (elements are divided by it first)
};

GPUEXT_HD BlockScale ComputeBlockScale(int32_t format, int32_t rounding, uint32_t amax, uint32_t g) {
  const ElementRule r = ElementRuleOf(format);
  BlockScale s{0, amax >= kF32Inf, 0, 0};
  const Unpacked a = Decode(amax, F32Format());
  if (IsMx(format)) {
    int32_t e = a.k - r.max_k + ((rounding == kRoundUp && a.m > r.max_m) ? 1 : 0);
    e = e < -kE8M0Bias ? -kE8M0Bias : (e > kE8M0Bias ? kE8M0Bias : e);
    if (amax == 0) e = 0;
    s.k = e;
    s.stored = s.special ? kE8M0NaN : uint32_t(e + kE8M0Bias);
    return s;
  }
  if (format == kNvfp4) {
    // jax.nn's order (docs/formats.md): y = RN(amax / g), then y / 6 rounded once to E4M3
    // (RN(y / 6) first changes no E4M3 bit: y has 24 bits, so RN(y / 6) hits an E4M3 midpoint or
    // grid value v only when y == 6 v). "up": ceil, an all-zero block 1.0; "nearest": ties to
    // even, 0 for an all-zero or tiny block. Both saturate at 448.
    s.special = s.special || GlobalScaleInvalid(g);
    const Unpacked gu = Decode(g, F32Format());
    const bool up = rounding != kRoundNearest;
    uint32_t code = up ? kE4M3One : 0u;
    if (amax != 0) {
      const Unpacked y = Divide(a.k, a.m, gu.k, gu.m);
      const Unpacked q = Divide(y.k, y.m, r.max_k, r.max_m);
      code = RoundTo(0, q.k, q.m, E4M3Format(), up, /*saturate=*/true);
    }
    s.stored = s.special ? E4M3Format().nan_code : code;
    const Unpacked sb = Decode(code, E4M3Format());
    s.k = sb.k;
    s.m = sb.m;
    s.g = g;
    return s;
  }
  // FP8 blockwise and per-tensor: RN(amax / 448), at least 2^-126; 1 for an all-zero block
  uint32_t bits = kF32One;
  if (amax != 0) {
    Unpacked q = Divide(a.k, a.m, r.max_k, r.max_m);
    if (q.k < kMinNormalExp) q = Unpacked{0, kMinNormalExp, 1u << 23};
    bits = EncodeF32(q.k, q.m);
  }
  s.stored = s.special ? kF32NaN : bits;
  const Unpacked su = Decode(bits, F32Format());
  s.k = su.k;
  s.m = su.m;
  return s;
}

// One element (fp32 bits) -> its element code.
GPUEXT_HD uint32_t QuantizeElement(int32_t format, const BlockScale& s, uint32_t x) {
  if (s.special) return 0;
  const ElementRule r = ElementRuleOf(format);
  const Unpacked u = Decode(x, F32Format());
  if (IsMx(format)) return RoundTo(u.sign, u.k - s.k, u.m, r.elem, false, true);
  if (u.m == 0) return uint32_t(u.sign) << r.elem.sign_shift();
  if (format == kNvfp4) {  // RN(RN(x / g) / s_b); x / 0 saturates to +-6 (jax.nn's and TE's bits)
    if (s.m == 0) return (uint32_t(u.sign) << r.elem.sign_shift()) | r.elem.max_code;
    const Unpacked gu = Decode(s.g, F32Format());
    const Unpacked xs = Divide(u.k, u.m, gu.k, gu.m);
    const Unpacked q = Divide(xs.k, xs.m, s.k, s.m);
    return RoundTo(u.sign, q.k, q.m, r.elem, false, true);
  }
  const Unpacked q = Divide(u.k, u.m, s.k, s.m);
  return RoundTo(u.sign, q.k, q.m, r.elem, false, true);
}

// One element code and its block's stored scale -> output bits of `out`.
GPUEXT_HD uint32_t DequantizeElement(int32_t format, uint32_t code, uint32_t scale, uint32_t g, BitFormat out) {
  const ElementRule r = ElementRuleOf(format);
  BitFormat f = r.elem;
  const uint32_t mag = code & ((1u << f.sign_shift()) - 1u);
  const uint32_t sign = (code >> f.sign_shift()) & 1u;
  const bool exp_all_ones = (mag >> f.mbits) == (1u << f.ebits) - 1u;
  const uint32_t frac = mag & ((1u << f.mbits) - 1u);
  bool nan = false;
  if (format == kMxfp8E4m3 || HasF32Scale(format)) nan = mag == f.nan_code;
  if (format == kMxfp8E5m2) {
    nan = exp_all_ones && frac != 0;
    if (exp_all_ones && frac == 0 && scale != kE8M0NaN) return (sign << out.sign_shift()) | (out.max_code + 1);
  }
  const Unpacked u = Decode(code, f);
  Unpacked y{u.sign, 0, 0};
  if (IsMx(format)) {
    nan = nan || scale == kE8M0NaN;
    y.k = u.k + int32_t(scale) - kE8M0Bias;
    y.m = u.m;
  } else if (format == kNvfp4) {
    nan = nan || (scale & 0x7Fu) == E4M3Format().nan_code || GlobalScaleInvalid(g);
    const Unpacked s = Decode(scale, E4M3Format());
    y.sign ^= s.sign;  // data x scale: a negative (hand-built) scale flips the sign
    if (!nan && u.m != 0 && s.m != 0) {
      const Unpacked gu = Decode(g, F32Format());
      const Unpacked t = Multiply(u.k, u.m, s.k, s.m);  // exact: 2 x 4 significand bits
      const Unpacked p = Multiply(t.k, t.m, gu.k, gu.m);
      y.k = p.k;
      y.m = p.m;
    }
  } else {
    nan = nan || (scale & kF32AbsMask) >= kF32Inf;
    const Unpacked s = Decode(scale, F32Format());
    y.sign ^= s.sign;
    if (!nan && u.m != 0 && s.m != 0) {
      const Unpacked p = Multiply(u.k, u.m, s.k, s.m);
      y.k = p.k;
      y.m = p.m;
    }
  }
  if (nan) return out.nan_code;
  return RoundTo(y.sign, y.k, y.m, out);
}

}  // namespace gpuext::formats
