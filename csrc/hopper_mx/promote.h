// The scale arithmetic of the hopper_mx kernel (hopper_mx_kernel.cuh), in host and device code
// alike (GPUEXT_HD): the promotion of a k32 partial into the float32 accumulator and the rescan
// of an output element whose float32 sum left the finite range. No CUDA types: g++ builds this
// header into tests/native/hopper_mx_promote.cc, so the CPU test (tests/dot/test_extreme_scales.py)
// checks the arithmetic the kernel runs, not a model of it. nvcc compiles it without -ftz and
// without fast math (CMakeLists.txt), so device float arithmetic keeps subnormals, as the host's.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "csrc/common/host_device.h"

namespace gpuext::hopper_mx {

GPUEXT_HD uint32_t FloatBits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

GPUEXT_HD float BitsFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

// One rounding of a * b + c (PTX fma.rn.f32; std::fma on the host, correctly rounded too).
GPUEXT_HD float Fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// a * b rounded once: never contracted into a neighbouring add (PTX mul.rn.f32).
GPUEXT_HD float Mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

GPUEXT_HD bool IsFinite(float x) { return (FloatBits(x) & 0x7F800000u) != 0x7F800000u; }

// A nonzero partial of 32 FP8 products has 2^-32 <= |part| < 2^37 (E5M2 x E5M2 extremes), so
// part * s is a normal fp32 (or zero), hence exact for power-of-two s, whenever
// 2^-94 <= |s| < 2^92: fp32 exponent fields 33..218, the E8M0 codes 33..218. One unsigned compare.
GPUEXT_HD bool ScaleInWindow(float s) { return ((FloatBits(s) >> 23) & 0xFFu) - 33u <= 218u - 33u; }

// The kernel's fast scale step: x = part * sa (FMUL), then fma(x, sb, acc).
GPUEXT_HD float FastStep(float part, float sa, float sb, float acc) { return Fma(Mul(part, sa), sb, acc); }

// Whether the fast step adds part * sa * sb exactly (one rounding) for every partial and every sb:
// sa in the window, or sa == 0. A zero scale makes the term an exact zero (NaN for an inf / NaN
// partial, as the definition's product) whatever sb is, where PromoteExact's other order would
// first form part * sb. Zero scales are the rows past M (the padding prepare_mx adds and TMA's
// fill: for a decode batch of M <= 16 every warp but the first holds only such rows) and NVFP4's
// zero block code; without this, those warps took PromoteExact (~5x the instructions of the step).
GPUEXT_HD bool TakesFastStep(float sa) { return sa == 0.0f || ScaleInWindow(sa); }

// acc + part * sa * sb with the FFMA's one rounding wherever that term is representable, for every
// pair of E8M0 scales (issue 34, finding 2; docs/design.md "The smallest and largest MX scales"):
//   sa in the window: (part * sa) exact, then fma(x, sb, acc) (the fast step's order);
//   else sb in the window: the other order, (part * sb) exact, then fma(x, sa, acc);
//   else both outside: in opposite directions (one below 2^-94, one at or above 2^92) sa * sb is
//     a normal power of two in [2^-35, 2^33), and fma(part, sa * sb, acc) takes the exact product;
//     in the same direction the term is below 2^-150 (rounds to nothing) or overflows whatever
//     the order, and the fast step's order keeps a zero partial zero (0 * inf would be NaN).
// A NaN scale gives NaN in every branch, as in the fast step. A term (or a running sum) past
// float32's range is inf here; what that does to the element (inf - inf = NaN where the exact sum
// is a huge finite number) the epilogue repairs with RescanElement.
GPUEXT_HD float PromoteExact(float part, float sa, float sb, float acc) {
  if (ScaleInWindow(sa)) return FastStep(part, sa, sb, acc);
  if (ScaleInWindow(sb)) return Fma(Mul(part, sb), sa, acc);
  const float s = Mul(sa, sb);
  const unsigned e = (FloatBits(s) >> 23) & 0xFFu;
  return (e != 0u && e != 0xFFu) ? Fma(part, s, acc) : Fma(Mul(part, sa), sb, acc);
}

// ------------------------------------------------------------------------ the rescan
// The kernel accumulates sum_j part_j * sa_j * sb_j in float32. Where that sum leaves float32's
// range the result is inf, and two such terms (or partial sums) of opposite signs give NaN,
// although the float64 definition is a finite number past float32's range (so +-inf once rounded)
// or, after cancellation, a representable one (the H200 run of 3ff9b82: rows of 2^127 scales
// against columns of 2^100..2^127, 144 NaN where float64 says +-inf). Such an element is
// recomputed from the operands in a scaled domain, sum * 2^-200: every finite term there is below
// 2^39 * 2^(127 + 127 - 200) = 2^93 (scales are below float32's 2^128), K/32 < 2^26 of them cannot
// overflow, and what is lost below 2^-149 there (2^51 here, per term) is nothing next to the
// 2^128 that some term or partial sum of this element reached. Non-finite partials (inf / NaN elements) and
// scales keep the definition's inf / NaN. Only elements whose first sum is not finite are
// rescanned: ordinary operands never get here.
inline constexpr float kRescanUp = 0x1p100f;  // the scaled domain is sum * 2^-200: twice at the end

// An FP8 byte as float (exact): E4M3 (fn: bias 7, no inf, S.1111.111 NaN) or E5M2 (bias 15,
// S.11111.00 inf, S.11111.xx NaN).
GPUEXT_HD float Fp8ToFloat(uint8_t v, bool e5m2) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  const uint32_t mant_bits = e5m2 ? 2u : 3u, bias = e5m2 ? 15u : 7u;
  const uint32_t exp = (v & 0x7Fu) >> mant_bits, mant = v & ((1u << mant_bits) - 1u);
  if (e5m2 ? exp == 31u : (exp == 15u && mant == 7u)) {
    return BitsFloat(sign | 0x7F800000u | (mant != 0u ? 0x400000u : 0u));
  }
  if (exp == 0u) {  // subnormal: mant * 2^(1 - bias - mant_bits), exact in float32
    const float mag = static_cast<float>(mant) * (e5m2 ? 0x1p-16f : 0x1p-9f);
    return sign ? -mag : mag;
  }
  return BitsFloat(sign | ((exp - bias + 127u) << 23) | (mant << (23u - mant_bits)));
}

// 2^e as a float, e in [-149, 127] (subnormal below -126).
GPUEXT_HD float Pow2(int e) {
  return BitsFloat(e >= -126 ? static_cast<uint32_t>(e + 127) << 23 : 1u << (e + 149));
}

// s = m * 2^e with |m| in [1, 2) (m keeps s's sign), for finite nonzero s, subnormals included.
GPUEXT_HD float SplitScale(float s, int* e) {
  uint32_t bits = FloatBits(s);
  int bias = 127;
  if ((bits & 0x7F800000u) == 0u) {  // subnormal: 2^64 s is normal and exact
    bits = FloatBits(Mul(s, 0x1p64f));
    bias += 64;
  }
  *e = static_cast<int>((bits >> 23) & 0xFFu) - bias;
  return BitsFloat((bits & 0x807FFFFFu) | 0x3F800000u);
}

// acc (the scaled domain) + part * sa * sb * 2^-200, from the scales' exponents: nothing
// overflows (|part * ma * mb| < 2^39, 2^(ea + eb - 200) <= 2^54) and nothing underflows early, so
// each term is off by at most a rounding of its own (relative 2^-24, or 2^-149 absolute here, 2^51
// in the true domain); one-sided pre-scaling (sa * 2^-100) would lose terms of up to 2^115 with a
// tiny sa and a huge sb.
GPUEXT_HD float RescanStep(float part, float sa, float sb, float acc) {
  // An inf / NaN partial or scale: the definition's inf / NaN ((part * sa) * sb never turns an
  // inf into NaN through an intermediate that underflowed).
  if (!IsFinite(part) || !IsFinite(sa) || !IsFinite(sb)) return acc + Mul(Mul(part, sa), sb);
  if (part == 0.f || sa == 0.f || sb == 0.f) return acc;
  int ea = 0, eb = 0;
  const float ma = SplitScale(sa, &ea), mb = SplitScale(sb, &eb);
  const float x = Mul(Mul(part, ma), mb);  // 2^-32 <= |x| < 2^39: normal
  const int e = ea + eb - 200;             // <= 54
  if (e >= -149) return Fma(x, Pow2(e), acc);
  if (e >= -213) return Fma(Mul(x, 0x1p-64f), Pow2(e + 64), acc);  // x 2^-64 >= 2^-96: exact
  return acc;  // |term| < 2^(39 - 214): below the scaled domain's resolution
}

// One output element from the operands: row `a` and row `b` (K FP8 bytes each, K = 32 * k_blocks),
// their scales sa[j * sa_stride], sb[j * sb_stride] for block j. The partials are summed in float32
// here (the tensor cores' own order and rounding differ, within the 1e-3 of sum |terms| both keep).
// Stops at the first NaN: nothing after it changes the result.
GPUEXT_HD float RescanElement(const uint8_t* a, const uint8_t* b, const float* sa, int64_t sa_stride,
                             const float* sb, int64_t sb_stride, int k_blocks, bool a_e5m2, bool b_e5m2) {
  float acc = 0.f;
  for (int j = 0; j < k_blocks; ++j) {
    float part = 0.f;
    for (int t = 0; t < 32; ++t) part = Fma(Fp8ToFloat(a[32 * j + t], a_e5m2), Fp8ToFloat(b[32 * j + t], b_e5m2), part);
    acc = RescanStep(part, sa[j * sa_stride], sb[j * sb_stride], acc);
    if (acc != acc) break;
  }
  return Mul(Mul(acc, kRescanUp), kRescanUp);  // exact, then one rounding (to inf past float32)
}

}  // namespace gpuext::hopper_mx
