// The CUDA kernels' per-element fast paths (csrc/formats/block_scaled_fast.h), compiled for the host
// with their software conversions, against the scalar rules of csrc/formats/block_scaled_math.h
// (the header the CPU handler runs and its tests check against an independent float64 model).
// Built and run by tests/formats/test_fast_math.py; prints "ok <checks>" or the first mismatch.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "csrc/formats/block_scaled_fast.h"
#include "csrc/formats/block_scaled_io.h"

using namespace gpuext::formats;
namespace fast = gpuext::formats::fast;

static long checks = 0;

static void Fail(const char* what, uint32_t x, uint32_t got, uint32_t want, double extra) {
  std::printf("MISMATCH %s: x=0x%08x got=0x%x want=0x%x (%.17g)\n", what, x, got, want, extra);
  std::exit(1);
}

// Every finite bf16 value (both signs) as fp32 bits, plus f16 values widened, plus random f32.
static std::vector<uint32_t> Inputs() {
  std::vector<uint32_t> v;
  for (uint32_t h = 0; h < 0x7F80; ++h) {
    v.push_back(h << 16);
    v.push_back((h << 16) | 0x80000000u);
  }
  for (uint32_t h = 0; h < 0x7C00; h += 3) v.push_back(HalfToF32Bits(h));
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) {
    uint32_t b = rng() & 0xFF7FFFFFu;  // finite
    v.push_back(b);
  }
  return v;
}

template <int32_t kFmt>
static void CheckMx(const std::vector<uint32_t>& xs) {
  for (int32_t k = -127; k <= 126; ++k) {
    BlockScale s{uint32_t(k + 127), false, k, 0, kF32One};
    const fast::ElemParams p = fast::ParamsOf<kFmt>(s);
    for (uint32_t x : xs) {
      // the fast path is used for |x| <= amax, so |x| 2^-k < 2^(max_k + 2) for every rounding
      const int32_t ex = int32_t((x >> 23) & 0xFF) - 127;
      if (ex - k > ElementRuleOf(kFmt).max_k + 1) continue;
      const uint32_t want = QuantizeElement(kFmt, s, x);
      const uint32_t got = fast::QuantizeAny<kFmt>(x, p, nullptr, kF32One);
      ++checks;
      if (got != want) Fail("mx element", x, got, want, k);
      if constexpr (kFmt != kMxfp4) {
        const uint32_t pair = fast::QuantizeFastPair<kFmt>(x, x ^ 0x80000000u, p, p);
        if ((pair & 0xFF) != want || (pair >> 8) != (want ^ 0x80u)) Fail("mx pair", x, pair, want, k);
      }
    }
  }
}

template <int32_t kFmt>
static void CheckFp8(const std::vector<uint32_t>& xs) {
  std::mt19937 rng(11);
  std::vector<uint32_t> amaxes;
  for (int j = -125; j <= 125; j += 3) amaxes.push_back(FloatToBits(std::ldexp(448.0f, j)));  // exact divisors
  for (int j = -100; j <= -80; ++j) amaxes.push_back(FloatToBits(std::ldexp(448.0f * 1.37f, j)));  // the 2^-91 bound
  for (int i = 0; i < 300; ++i) amaxes.push_back((rng() & 0x7F7FFFFFu) | 0x00800000u);
  for (uint32_t amax : amaxes) {
    const BlockScale s = ComputeBlockScale(kFmt, kRoundUp, amax, kF32One);
    const fast::ElemParams p = fast::ParamsOf<kFmt>(s);
    for (uint32_t x : xs) {
      if ((x & kF32AbsMask) > amax) continue;
      const uint32_t want = QuantizeElement(kFmt, s, x);
      const uint32_t got = fast::QuantizeAny<kFmt>(x, p, nullptr, kF32One);
      ++checks;
      if (got != want) Fail("fp8 element", x, got, want, BitsToFloat(amax));
    }
    // quotients near E4M3's ties for this divisor: t * s (t a tie) and its neighbours
    for (int t = 1; t < 900; ++t) {
      const float base = float(t) * 0.5f * BitsToFloat(s.stored);
      for (int d = -2; d <= 2; ++d) {
        const uint32_t x = FloatToBits(base) + uint32_t(d);
        if ((x & kF32AbsMask) > amax || !std::isfinite(BitsToFloat(x))) continue;
        const uint32_t want = QuantizeElement(kFmt, s, x);
        const uint32_t got = fast::QuantizeAny<kFmt>(x, p, nullptr, kF32One);
        ++checks;
        if (got != want) Fail("fp8 tie", x, got, want, BitsToFloat(amax));
        const uint32_t pair = fast::QuantizeFastPair<kFmt>(x, x, p, p);
        if (p.fast && (pair & 0xFF) != want) Fail("fp8 pair", x, pair, want, BitsToFloat(amax));
      }
    }
  }
}

static void CheckNvfp4(const std::vector<uint32_t>& xs) {
  const float gs[] = {1.0f, 0.37f, 1.0f / 2688.0f, std::ldexp(1.0f, -126), std::ldexp(1.3f, -120), std::ldexp(1.7f, 100),
                      std::ldexp(1.0f, 120), 3.1e-30f / 7};
  for (float gf : gs) {
    const uint32_t g = FloatToBits(gf);
    for (uint32_t code = 0; code <= 0x7E; ++code) {
      uint32_t u[7];
      for (int i = 0; i < 7; ++i) u[i] = fast::Nvfp4TableEntry(code, i, g);
      const Unpacked sc = Decode(code, E4M3Format());
      BlockScale s{code, false, sc.k, sc.m, g};
      fast::ElemParams p = fast::ParamsOf<kNvfp4>(s);
      const double top = 7.0 * double(BitsToFloat(EncodeF32(sc.k, sc.m == 0 ? (1u << 23) : sc.m))) * gf;
      for (uint32_t x : xs) {
        if (double(BitsToFloat(x & kF32AbsMask)) > top && ((x >> 3) & 7) != 0) continue;  // a sample beyond
        const uint32_t want = QuantizeElement(kNvfp4, s, x);
        const uint32_t got = fast::QuantizeAny<kNvfp4>(x, p, u, g);
        ++checks;
        if (got != want) Fail("nvfp4 element", x, got, want, gf);
      }
    }
  }
}

// The 16-bit kernels' NVFP4 path: two elements a word against packed 16-bit thresholds
// (fast::Nvfp4PairCodes16), every finite bf16 / f16 magnitude in either half with both signs, beside
// a second element under another block scale, for every E4M3 block scale and the 8 global scales,
// against the fp32-threshold path (checked against the scalar rule above) and, for every 7th value,
// against the scalar rule itself.
static void CheckNvfp4Pairs16() {
  const float gs[] = {1.0f, 0.37f, 1.0f / 2688.0f, std::ldexp(1.0f, -126), std::ldexp(1.3f, -120), std::ldexp(1.7f, 100),
                      std::ldexp(1.0f, 120), 3.1e-30f / 7};
  for (const bool f16 : {false, true}) {
    const uint32_t top = f16 ? 0x7C00u : 0x7F80u;  // first non-finite magnitude
    const auto widen = [&](uint32_t h) { return f16 ? HalfToF32Bits(h) : h << 16; };
    for (float gf : gs) {
      const uint32_t g = FloatToBits(gf);
      for (uint32_t c0 = 0; c0 <= 0x7F; ++c0) {
        const uint32_t c1 = (c0 * 37 + 11) & 0x7F;  // 0x7F: a NaN scale's row (all thresholds 0)
        uint32_t u0[7], u1[7], w[7];
        for (int i = 0; i < 7; ++i) {
          u0[i] = fast::Nvfp4TableEntry(c0, i, g);
          u1[i] = fast::Nvfp4TableEntry(c1, i, g);
          w[i] = (fast::Nvfp4PackedThreshold(u0[i], f16) & 0xFFFFu) | (fast::Nvfp4PackedThreshold(u1[i], f16) & 0xFFFF0000u);
        }
        BlockScale s0{c0, false, 0, 0, g};
        if (c0 != 0 && c0 != 0x7F) {
          const Unpacked sc = Decode(c0, E4M3Format());
          s0.k = sc.k, s0.m = sc.m;
        }
        const fast::ElemParams p0 = fast::ParamsOf<kNvfp4>(s0), p1 = fast::ParamsOf<kNvfp4>(BlockScale{c1, false, 0, 0, g});
        for (uint32_t h = 0; h < top; ++h) {
          const uint32_t other = (h * 7919u + 13u) % top;
          for (uint32_t signs = 0; signs < 4; ++signs) {
            const uint32_t x0 = h | ((signs & 1u) << 15), x1 = other | ((signs >> 1) << 15);
            const uint32_t got = fast::Nvfp4PairCodes16(x0 | (x1 << 16), w);
            const uint32_t want0 = fast::QuantizeFastElement<kNvfp4>(widen(x0), p0, u0);
            const uint32_t want1 = fast::QuantizeFastElement<kNvfp4>(widen(x1), p1, u1);
            checks += 2;
            if ((got & 0xFFFFu) != want0) Fail(f16 ? "nvfp4 f16 pair, element 0" : "nvfp4 bf16 pair, element 0", x0, got, want0, gf);
            if ((got >> 16) != want1) Fail(f16 ? "nvfp4 f16 pair, element 1" : "nvfp4 bf16 pair, element 1", x1, got, want1, gf);
            if (h % 7 == 0 && c0 != 0x7F) {
              const uint32_t rule = QuantizeElement(kNvfp4, s0, widen(x0));
              ++checks;
              if ((got & 0xFFFFu) != rule) Fail("nvfp4 16-bit pair vs the scalar rule", x0, got, rule, gf);
            }
          }
        }
      }
    }
  }
}

template <int32_t kFmt>
static void CheckDequant() {
  std::mt19937 rng(3);
  std::vector<uint32_t> scales, globals{kF32One, FloatToBits(0.37f), FloatToBits(std::ldexp(1.0f, -120)),
                                         FloatToBits(std::ldexp(1.5f, 110))};
  if (fast::kMx(kFmt) || kFmt == kNvfp4) {
    for (uint32_t s = 0; s < 256; ++s) scales.push_back(s);
  } else {
    for (int i = 0; i < 4000; ++i) scales.push_back(rng());
    for (int j = -127; j <= 127; ++j) scales.push_back(FloatToBits(std::ldexp(1.0f, j)));
  }
  const uint32_t ncodes = fast::kFp4(kFmt) ? 16 : 256;
  const FloatType outs[] = {FloatType::kF32, FloatType::kBF16, FloatType::kF16};
  for (uint32_t g : globals) {
    if (kFmt != kNvfp4 && g != kF32One) continue;
    for (uint32_t scale : scales) {
      float m0, m1;
      if (!fast::DequantParams<kFmt>(scale, g, &m0, &m1)) continue;
      for (uint32_t code = 0; code < ncodes; ++code) {
        const bool special = fast::AnySpecialCode4<kFmt>(code);
        for (FloatType out : outs) {
          const uint32_t want = DequantizeElement(kFmt, code, scale, g, OutputFormat(out));
          ++checks;
          if (special) continue;
          const uint32_t got = fast::RoundF32To(fast::DequantFastValue<kFmt>(code, m0, m1), out);
          if (got != want) Fail("dequant", code, got, want, BitsToFloat(scale));
        }
      }
    }
  }
  // AnySpecialCode4 flags exactly the NaN / Inf codes
  for (uint32_t code = 0; code < ncodes; ++code) {
    const uint32_t y = DequantizeElement(kFmt, code, fast::kMx(kFmt) ? 127u : (kFmt == kNvfp4 ? 0x38u : kF32One), kF32One,
                                         F32Format());
    const bool nonfinite = (y & kF32AbsMask) >= kF32Inf;
    if (nonfinite != fast::AnySpecialCode4<kFmt>(code)) Fail("special code", code, nonfinite, 0, 0);
  }
}

static void CheckE2M1Direct() {
  // every fp32 value in [0, 16) with a short significand, plus random: E2M1Sat == RoundTo(E2M1, sat)
  std::mt19937 rng(5);
  for (int i = 0; i < 3000000; ++i) {
    const float v = i < 1000000 ? float(i) / 65536.0f : BitsToFloat(rng() & 0x7FFFFFFFu) ;
    if (!(v < 1e6f)) continue;
    const Unpacked u = Decode(FloatToBits(v), F32Format());
    const uint32_t want = RoundTo(0, u.k, u.m, E2M1Format(), false, true);
    ++checks;
    if (fast::E2M1Sat(v) != want) Fail("e2m1", FloatToBits(v), fast::E2M1Sat(v), want, v);
  }
}

int main() {
  const std::vector<uint32_t> xs = Inputs();
  CheckE2M1Direct();
  CheckMx<kMxfp8E4m3>(xs);
  CheckMx<kMxfp8E5m2>(xs);
  CheckMx<kMxfp4>(xs);
  CheckFp8<kFp8Blockwise1x128>(xs);
  CheckNvfp4(xs);
  CheckNvfp4Pairs16();
  CheckDequant<kMxfp8E4m3>();
  CheckDequant<kMxfp8E5m2>();
  CheckDequant<kMxfp4>();
  CheckDequant<kNvfp4>();
  CheckDequant<kFp8Blockwise1x128>();
  std::printf("ok %ld\n", checks);
  return 0;
}
