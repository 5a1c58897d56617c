// Element types, reduction operators and the narrow-float codecs of the all-reduce, shared
// by the CPU protocol (g++) and the CUDA kernels (nvcc) so that both round the same way.
//
// Numerics (docs/allreduce.md): every rank reduces the contributions in rank order 0..n-1,
// so one_shot and two_shot give bit-identical results on every rank. float16, bfloat16 and
// the float8 formats accumulate in float32 and are rounded once (round-to-nearest-even);
// integers wrap (two's complement) like XLA's all-reduce; float max/min are IEEE 754-2019
// maximum/minimum (NaN wins, -0 < +0); a float sum starts from the first contribution, not
// from +0, so it is -0 exactly when every contribution is -0 (docs/design.md, issue 26).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "csrc/common/host_device.h"

namespace gpuext::allreduce {

// Our own dtype enum: csrc/ must not see XLA's ffi::DataType (ffi/ maps one to the other).
enum class DType : int32_t {
  kF32, kF64, kF16, kBF16, kF8E4M3FN, kF8E5M2,
  kS8, kU8, kS32, kU32, kS64, kU64, kPred,
};

// Attribute values: jax_gpuext/collectives.py uses the same numbers.
enum class ReduceOp : int32_t { kSum = 0, kMax = 1, kMin = 2, kProd = 3, kAnd = 4, kOr = 5 };
enum class Algorithm : int32_t { kOneShot = 1, kTwoShot = 2, kLibrary = 3 };

inline int ByteWidth(DType t) {
  switch (t) {
    case DType::kF64: case DType::kS64: case DType::kU64: return 8;
    case DType::kF32: case DType::kS32: case DType::kU32: return 4;
    case DType::kF16: case DType::kBF16: return 2;
    default: return 1;
  }
}

inline const char* OpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kProd: return "prod";
    case ReduceOp::kAnd: return "and";
    case ReduceOp::kOr: return "or";
  }
  return "?";
}

// --------------------------------------------------------------------------- codecs
GPUEXT_HD float BitsToFloat(uint32_t b) { float f; memcpy(&f, &b, 4); return f; }
GPUEXT_HD uint32_t FloatToBits(float f) { uint32_t b; memcpy(&b, &f, 4); return b; }

// A binary float format with E exponent bits, M mantissa bits and IEEE bias. kFnNan: the
// "fn" convention of float8_e4m3fn (no infinities, S.1111.111 is NaN, 448 the max).
template <int E, int M, bool kFnNan>
struct MiniFloat {
  static constexpr int kBias = (1 << (E - 1)) - 1;
  static constexpr uint32_t kExpMask = (1u << E) - 1;
  static constexpr uint32_t kNan = kFnNan ? 0x7Fu : ((kExpMask << M) | (1u << (M - 1)));
  // Largest finite magnitude code: fn formats lose only the all-ones mantissa of the top exponent.
  static constexpr uint32_t kMaxFinite = kFnNan ? ((kExpMask << M) | ((1u << M) - 2)) : ((kExpMask - 1) << M) | ((1u << M) - 1);
  static constexpr uint32_t kSign = 1u << (E + M);

  GPUEXT_HD static float Decode(uint32_t code) {
    const uint32_t sign = (code & kSign) ? 0x80000000u : 0u;
    const uint32_t e = (code >> M) & kExpMask, m = code & ((1u << M) - 1);
    if (kFnNan ? (e == kExpMask && m == (1u << M) - 1) : (e == kExpMask)) {
      if (kFnNan || m != 0) return BitsToFloat(0x7FC00000u | sign);
      return BitsToFloat(0x7F800000u | sign);
    }
    if (e == 0) {  // subnormal: m * 2^(1 - bias - M), exact in float32
      float v = static_cast<float>(m) * BitsToFloat(static_cast<uint32_t>(127 + 1 - kBias - M) << 23);
      return sign ? -v : v;
    }
    return BitsToFloat(sign | ((e - kBias + 127) << 23) | (m << (23 - M)));
  }

  // Round-to-nearest-even on the bit pattern; overflow gives inf (IEEE-like) or NaN (fn),
  // as ml_dtypes and XLA's convert do.
  GPUEXT_HD static uint32_t Encode(float f) {
    const uint32_t b = FloatToBits(f);
    const uint32_t sign = (b & 0x80000000u) ? kSign : 0u;
    const int fe = static_cast<int>((b >> 23) & 0xFF);
    const uint32_t fm = b & 0x7FFFFFu;
    if (fe == 0xFF) return fm ? (kNan | sign) : (kFnNan ? (kNan | sign) : (sign | (kExpMask << M)));
    if (fe == 0) return sign;  // float32 zero/subnormal is far below our smallest subnormal
    const int e = fe - 127;
    uint64_t q;
    if (e >= 1 - kBias) {  // normal in the target format
      const int shift = 23 - M;
      q = fm >> shift;
      const uint32_t rem = fm & ((1u << shift) - 1), half = 1u << (shift - 1);
      if (rem > half || (rem == half && (q & 1))) ++q;
      q += static_cast<uint64_t>(e + kBias) << M;  // a mantissa carry bumps the exponent
    } else {  // subnormal: value in units of 2^(1 - bias - M)
      const int shift = 23 + (1 - kBias - M) - e;
      if (shift > 40) return sign;
      const uint64_t full = (1ull << 23) | fm;
      q = full >> shift;
      const uint64_t rem = full & ((1ull << shift) - 1), half = 1ull << (shift - 1);
      if (rem > half || (rem == half && (q & 1))) ++q;
    }
    if (q > kMaxFinite) return kFnNan ? (kNan | sign) : (sign | (kExpMask << M));
    return static_cast<uint32_t>(q) | sign;
  }
};

using F16Codec = MiniFloat<5, 10, false>;
using E4M3Codec = MiniFloat<4, 3, true>;
using E5M2Codec = MiniFloat<5, 2, false>;

GPUEXT_HD float Bf16Decode(uint16_t v) { return BitsToFloat(static_cast<uint32_t>(v) << 16); }
GPUEXT_HD uint16_t Bf16Encode(float f) {
  uint32_t b = FloatToBits(f);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((b >> 16) | 0x40);  // quiet NaN
  b += 0x7FFFu + ((b >> 16) & 1);
  return static_cast<uint16_t>(b >> 16);
}

// --------------------------------------------------------------------------- element traits
// Storage type S, accumulator A, and the conversions between them.
template <DType T> struct Elem;
#define GPUEXT_PLAIN_ELEM(TAG, S)                                   \
  template <> struct Elem<DType::TAG> {                              \
    using Storage = S;                                               \
    using Acc = S;                                                   \
    GPUEXT_HD static Acc Load(Storage v) { return v; }               \
    GPUEXT_HD static Storage Store(Acc v) { return v; }              \
  }
GPUEXT_PLAIN_ELEM(kF32, float);
GPUEXT_PLAIN_ELEM(kF64, double);
GPUEXT_PLAIN_ELEM(kS8, int8_t);
GPUEXT_PLAIN_ELEM(kU8, uint8_t);
GPUEXT_PLAIN_ELEM(kS32, int32_t);
GPUEXT_PLAIN_ELEM(kU32, uint32_t);
GPUEXT_PLAIN_ELEM(kS64, int64_t);
GPUEXT_PLAIN_ELEM(kU64, uint64_t);
GPUEXT_PLAIN_ELEM(kPred, uint8_t);
#undef GPUEXT_PLAIN_ELEM

#define GPUEXT_NARROW_FLOAT_ELEM(TAG, S, DECODE, ENCODE)                        \
  template <> struct Elem<DType::TAG> {                                          \
    using Storage = S;                                                           \
    using Acc = float;                                                           \
    GPUEXT_HD static Acc Load(Storage v) { return DECODE(v); }                   \
    GPUEXT_HD static Storage Store(Acc v) { return static_cast<S>(ENCODE(v)); }  \
  }
GPUEXT_NARROW_FLOAT_ELEM(kF16, uint16_t, F16Codec::Decode, F16Codec::Encode);
GPUEXT_NARROW_FLOAT_ELEM(kBF16, uint16_t, Bf16Decode, Bf16Encode);
GPUEXT_NARROW_FLOAT_ELEM(kF8E4M3FN, uint8_t, E4M3Codec::Decode, E4M3Codec::Encode);
GPUEXT_NARROW_FLOAT_ELEM(kF8E5M2, uint8_t, E5M2Codec::Decode, E5M2Codec::Encode);
#undef GPUEXT_NARROW_FLOAT_ELEM

template <typename A> GPUEXT_HD bool IsNan(A v) { return v != v; }

// The sign bit of a float or double (-0.0 has it; 0.0 == -0.0 cannot tell them apart).
GPUEXT_HD bool SignBit(float v) { return (FloatToBits(v) >> 31) != 0; }
GPUEXT_HD bool SignBit(double v) { uint64_t b; memcpy(&b, &v, 8); return (b >> 63) != 0; }

// Combines two accumulator values. Integer sums/products go through uint64 so that overflow
// wraps (defined behaviour) exactly as XLA's two's-complement all-reduce does.
template <ReduceOp Op, typename A>
GPUEXT_HD A Combine(A a, A b) {
  constexpr bool kFloat = std::is_floating_point_v<A>;
  if constexpr (Op == ReduceOp::kSum) {
    if constexpr (kFloat) return a + b;
    else return static_cast<A>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
  } else if constexpr (Op == ReduceOp::kProd) {
    if constexpr (kFloat) return a * b;
    else return static_cast<A>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
  } else if constexpr (Op == ReduceOp::kMax) {
    // IEEE 754-2019 maximum: NaN wins, and -0 < +0 (so the answer does not depend on rank order;
    // a plain a < b ? b : a kept whichever zero came first). jnp.maximum agrees.
    if constexpr (kFloat) {
      if (IsNan(a)) return a;
      if (IsNan(b)) return b;
      if (a == b) return SignBit(a) ? b : a;
    }
    return a < b ? b : a;
  } else if constexpr (Op == ReduceOp::kMin) {
    if constexpr (kFloat) {
      if (IsNan(a)) return a;
      if (IsNan(b)) return b;
      if (a == b) return SignBit(a) ? a : b;
    }
    return b < a ? b : a;
  } else if constexpr (Op == ReduceOp::kAnd) {
    return static_cast<A>((a != 0) && (b != 0));
  } else {
    return static_cast<A>((a != 0) || (b != 0));
  }
}

// Calls fn(std::integral_constant<DType, T>{}) for the runtime dtype; false if unknown.
// (A tag argument rather than a template lambda: C++17 for both g++ and nvcc.)
template <typename Fn>
bool VisitDType(DType t, Fn&& fn) {
  switch (t) {
    case DType::kF32: fn(std::integral_constant<DType, DType::kF32>{}); return true;
    case DType::kF64: fn(std::integral_constant<DType, DType::kF64>{}); return true;
    case DType::kF16: fn(std::integral_constant<DType, DType::kF16>{}); return true;
    case DType::kBF16: fn(std::integral_constant<DType, DType::kBF16>{}); return true;
    case DType::kF8E4M3FN: fn(std::integral_constant<DType, DType::kF8E4M3FN>{}); return true;
    case DType::kF8E5M2: fn(std::integral_constant<DType, DType::kF8E5M2>{}); return true;
    case DType::kS8: fn(std::integral_constant<DType, DType::kS8>{}); return true;
    case DType::kU8: fn(std::integral_constant<DType, DType::kU8>{}); return true;
    case DType::kS32: fn(std::integral_constant<DType, DType::kS32>{}); return true;
    case DType::kU32: fn(std::integral_constant<DType, DType::kU32>{}); return true;
    case DType::kS64: fn(std::integral_constant<DType, DType::kS64>{}); return true;
    case DType::kU64: fn(std::integral_constant<DType, DType::kU64>{}); return true;
    case DType::kPred: fn(std::integral_constant<DType, DType::kPred>{}); return true;
  }
  return false;
}

template <typename Fn>
bool VisitOp(ReduceOp op, Fn&& fn) {
  switch (op) {
    case ReduceOp::kSum: fn(std::integral_constant<ReduceOp, ReduceOp::kSum>{}); return true;
    case ReduceOp::kMax: fn(std::integral_constant<ReduceOp, ReduceOp::kMax>{}); return true;
    case ReduceOp::kMin: fn(std::integral_constant<ReduceOp, ReduceOp::kMin>{}); return true;
    case ReduceOp::kProd: fn(std::integral_constant<ReduceOp, ReduceOp::kProd>{}); return true;
    case ReduceOp::kAnd: fn(std::integral_constant<ReduceOp, ReduceOp::kAnd>{}); return true;
    case ReduceOp::kOr: fn(std::integral_constant<ReduceOp, ReduceOp::kOr>{}); return true;
  }
  return false;
}

}  // namespace gpuext::allreduce
