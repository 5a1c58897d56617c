// The hopper_mx kernel's scale arithmetic (csrc/hopper_mx/promote.h, the code the kernel runs)
// on the CPU, for tests/dot/test_extreme_scales.py. Built with g++ -std=c++17 -ffp-contract=off
// (no FMA contraction, IEEE subnormals: the device's fma.rn / mul.rn without -ftz).
//
//   hopper_mx_promote pairs
//     PromoteExact(part, 2^(a-127), 2^(b-127), 0) for every pair of E8M0 codes a, b in 0..254 and
//     partials at the edges of what 32 FP8 products give (2^-32 .. 2^37, both signs, 0), against
//     part * 2^(a+b-254) in double rounded once to float (exact: a 24-bit part times a power of two);
//     NaN scales (code 255) and inf / NaN partials; the fast step with a zero lhs scale (an exact
//     zero term for every sb) and TakesFastStep's window. Prints "checked N mismatches M" and the
//     first mismatches.
//   hopper_mx_promote fp8
//     Fp8ToFloat of all 256 bytes, E4M3 then E5M2, as 512 float bit patterns in hex (one a line).
//   hopper_mx_promote dot IN OUT RESCAN
//     The kernel's arithmetic for every output element of a prepared problem (what
//     jax_gpuext/dot/hopper_mx.py hands the kernel): IN holds int64 batch, m, n, k, a_e5m2,
//     b_e5m2, then A [batch, m, k] and B [batch, n, k] bytes, then the float32 scales
//     [batch, k/32, m_pad] and [batch, k/32, n_pad]. Per element: the k32 partials (float32 sums of
//     32 products; the tensor cores' order differs within the tests' 1e-3 of sum |terms|),
//     acc = the fast step where TakesFastStep(sa), PromoteExact elsewhere (a warp takes the fast
//     step only where all its rows pass; PromoteExact's first branch is that step, and for sa == 0
//     both give the exact zero term unless part * sb overflows, which MX rows with a zero scale, the
//     padding, never store), then, with RESCAN = 1, RescanElement where acc is not finite,
//     as the epilogue does. RESCAN = 0 is the kernel of 3ff9b82 (no rescan). OUT: float32 [batch, m, n].
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "csrc/hopper_mx/promote.h"

using namespace gpuext::hopper_mx;

namespace {

// 2^e, e in [-149, 127]: exact (computed apart from promote.h's Pow2)
float P2(int e) { return static_cast<float>(std::ldexp(1.0, e)); }

// Equal bits, any NaN equal to any NaN, and +0 == -0 (the sign of a zero sum depends on the
// accumulator's +0 and on which term underflowed, neither of which the definition fixes).
bool SameFloat(float x, float y) {
  return (std::isnan(x) && std::isnan(y)) || FloatBits(x) == FloatBits(y) || (x == 0 && y == 0);
}

int Pairs() {
  std::vector<float> parts = {0.0f, -0.0f, 1.0f, -1.0f, P2(-32), -P2(-32), std::nextafter(P2(-32), 1.0f),
                              std::nextafter(P2(37), 0.0f), -std::nextafter(P2(37), 0.0f), 3.0f * P2(-20),
                              0x1.fffffep+20f, -0x1.000002p-7f, 448.0f * 448.0f * 32.0f, 57344.0f * 57344.0f * 32.0f};
  // random 24-bit mantissas over the whole partial range
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (int i = 0; i < 48; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    const float mant = 1.0f + static_cast<float>(x & 0x7FFFFF) * 0x1p-23f;
    const int e = -32 + static_cast<int>((x >> 23) % 69);  // 2^-32 .. 2^36
    parts.push_back(((x >> 40) & 1) ? -std::ldexp(mant, e) : std::ldexp(mant, e));
  }
  long checked = 0, bad = 0;
  auto report = [&](float part, int a, int b, float got, float want) {
    if (bad++ < 10) std::printf("mismatch part=%a a=%d b=%d got=%a want=%a\n", part, a, b, got, want);
  };
  for (float part : parts) {
    for (int a = 0; a <= 254; ++a) {
      for (int b = 0; b <= 254; ++b) {
        const float sa = P2(a - 127), sb = P2(b - 127);
        const float got = PromoteExact(part, sa, sb, 0.0f);
        const float want = static_cast<float>(static_cast<double>(part) * std::ldexp(1.0, a + b - 254));
        ++checked;
        if (!SameFloat(got, want)) report(part, a, b, got, want);
        // the rescan's step keeps every finite term finite and in the scaled domain's range
        const float r = RescanStep(part, sa, sb, 0.0f);
        const double rwant = static_cast<double>(part) * std::ldexp(1.0, a + b - 254 - 200);
        ++checked;
        if (!std::isfinite(r) || std::fabs(r - rwant) > std::ldexp(1.0, -149) + std::fabs(rwant) * 0x1p-23) {
          report(part, a, b, r, static_cast<float>(rwant));
        }
      }
    }
  }
  const float nan = std::nanf(""), inf = INFINITY;
  for (float part : parts) {
    for (int a = 0; a <= 254; ++a) {  // a NaN scale on either side: NaN
      const float s = P2(a - 127);
      for (float got : {PromoteExact(part, nan, s, 0.0f), PromoteExact(part, s, nan, 0.0f),
                        RescanStep(part, nan, s, 0.0f), RescanStep(part, s, nan, 0.0f)}) {
        ++checked;
        if (!std::isnan(got)) report(part, a, 255, got, nan);
      }
    }
  }
  // A zero lhs scale (rows past M, NVFP4's zero code) takes the fast step (TakesFastStep): the term
  // is an exact zero, NaN for an inf / NaN partial (the definition's 0 x inf), for every sb.
  std::vector<float> all_parts = parts;
  all_parts.insert(all_parts.end(), {inf, -inf, nan});
  for (float part : all_parts) {
    for (int b = 0; b <= 255; ++b) {
      const float sb = b == 255 ? nan : P2(b - 127);
      for (float acc : {0.0f, 1.5f, -0x1.8p-7f}) {
        const float got = FastStep(part, 0.0f, sb, acc);
        const bool nan_term = std::isnan(part) || std::isinf(part) || std::isnan(sb);
        ++checked;
        if (!SameFloat(got, nan_term ? nan : acc)) report(part, -1, b, got, nan_term ? nan : acc);
      }
    }
  }
  for (int a = 0; a <= 255; ++a) {  // the window: E8M0 codes 33..218, and zero; never NaN
    const float sa = a == 255 ? nan : P2(a - 127);
    ++checked;
    if (TakesFastStep(sa) != (a >= 33 && a <= 218)) report(0.0f, a, -1, TakesFastStep(sa), a >= 33 && a <= 218);
  }
  ++checked;
  if (!TakesFastStep(0.0f) || !TakesFastStep(-0.0f)) report(0.0f, -1, -1, 0.0f, 1.0f);
  for (float part : {inf, -inf, nan}) {  // an inf / NaN partial: itself (inf x positive = inf) in the rescan
    for (int a = 0; a <= 254; a += 2) {
      for (int b = 0; b <= 254; b += 2) {
        const float got = RescanStep(part, P2(a - 127), P2(b - 127), 0.0f);
        ++checked;
        if (!SameFloat(got, part)) report(part, a, b, got, part);
      }
    }
  }
  std::printf("checked %ld mismatches %ld\n", checked, bad);
  return 0;
}

int Fp8() {
  for (int e5m2 = 0; e5m2 < 2; ++e5m2) {
    for (int v = 0; v < 256; ++v) std::printf("%08" PRIx32 "\n", FloatBits(Fp8ToFloat(static_cast<uint8_t>(v), e5m2)));
  }
  return 0;
}

template <typename T>
bool Read(std::FILE* f, T* dst, size_t count) {
  return std::fread(dst, sizeof(T), count, f) == count;
}

int Dot(const char* in_path, const char* out_path, bool rescan) {
  std::FILE* f = std::fopen(in_path, "rb");
  if (f == nullptr) return std::fprintf(stderr, "cannot open %s\n", in_path), 2;
  int64_t hdr[6];
  if (!Read(f, hdr, 6)) return std::fprintf(stderr, "short header\n"), 2;
  const int64_t batch = hdr[0], m = hdr[1], n = hdr[2], k = hdr[3];
  const bool a_e5m2 = hdr[4] != 0, b_e5m2 = hdr[5] != 0;
  const int64_t kb = k / 32, m_pad = (m + 3) / 4 * 4, n_pad = (n + 3) / 4 * 4;
  std::vector<uint8_t> a(batch * m * k), b(batch * n * k);
  std::vector<float> sa(batch * kb * m_pad), sb(batch * kb * n_pad);
  if (k % 32 != 0 || !Read(f, a.data(), a.size()) || !Read(f, b.data(), b.size()) ||
      !Read(f, sa.data(), sa.size()) || !Read(f, sb.data(), sb.size())) {
    return std::fprintf(stderr, "bad input\n"), 2;
  }
  std::fclose(f);
  std::vector<float> out(batch * m * n);
  for (int64_t bi = 0; bi < batch; ++bi) {
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t c = 0; c < n; ++c) {
        const uint8_t* ar = &a[(bi * m + r) * k];
        const uint8_t* br = &b[(bi * n + c) * k];
        const float* sar = &sa[bi * kb * m_pad + r];
        const float* sbc = &sb[bi * kb * n_pad + c];
        float acc = 0.0f;
        for (int64_t j = 0; j < kb; ++j) {
          float part = 0.0f;
          for (int t = 0; t < 32; ++t) {
            part = Fma(Fp8ToFloat(ar[32 * j + t], a_e5m2), Fp8ToFloat(br[32 * j + t], b_e5m2), part);
          }
          // each element as if its warp voted alone: both steps are exact where they are taken
          const float sa_j = sar[j * m_pad], sb_j = sbc[j * n_pad];
          acc = TakesFastStep(sa_j) ? FastStep(part, sa_j, sb_j, acc) : PromoteExact(part, sa_j, sb_j, acc);
        }
        if (rescan && !IsFinite(acc)) {
          acc = RescanElement(ar, br, sar, m_pad, sbc, n_pad, static_cast<int>(kb), a_e5m2, b_e5m2);
        }
        out[(bi * m + r) * n + c] = acc;
      }
    }
  }
  std::FILE* o = std::fopen(out_path, "wb");
  if (o == nullptr || std::fwrite(out.data(), sizeof(float), out.size(), o) != out.size()) return 2;
  std::fclose(o);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "pairs") == 0) return Pairs();
  if (argc >= 2 && std::strcmp(argv[1], "fp8") == 0) return Fp8();
  if (argc == 5 && std::strcmp(argv[1], "dot") == 0) return Dot(argv[2], argv[3], std::atoi(argv[4]) != 0);
  std::fprintf(stderr, "usage: hopper_mx_promote pairs | fp8 | dot IN OUT RESCAN\n");
  return 2;
}
