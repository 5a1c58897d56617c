// Element and scale storage shared by the CPU loops and the CUDA kernels.
// FP4 packing lives here and only here: unpacked = one E2M1 code per byte (low nibble);
// packed = element 2i in the low nibble and 2i+1 in the high nibble of byte i
// (tests/formats/test_formats_gpu.py::test_float4_buffer_layout checks which one XLA hands us).
#pragma once

#include <cstdint>

#include "csrc/formats/block_scaled_math.h"

namespace gpuext::formats {

GPUEXT_HD uint32_t LoadInputBits(const void* x, FloatType t, int64_t i) {
  switch (t) {
    case FloatType::kF32: return static_cast<const uint32_t*>(x)[i];
    case FloatType::kBF16: return uint32_t(static_cast<const uint16_t*>(x)[i]) << 16;
    default: return HalfToF32Bits(static_cast<const uint16_t*>(x)[i]);
  }
}

GPUEXT_HD uint32_t Fp4PackPair(uint32_t even, uint32_t odd) { return (even & 0xFu) | ((odd & 0xFu) << 4); }

GPUEXT_HD uint32_t LoadElementCode(const void* data, bool fp4_packed, int64_t i) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  if (!fp4_packed) return p[i] & 0xFFu;
  return (p[i >> 1] >> ((i & 1) * 4)) & 0xFu;
}

// Sequential (CPU) store; the CUDA kernels store whole bytes built with Fp4PackPair.
inline void StoreElementCodeSequential(void* data, bool fp4_packed, int64_t i, uint32_t code) {
  uint8_t* p = static_cast<uint8_t*>(data);
  if (!fp4_packed) {
    p[i] = uint8_t(code);
    return;
  }
  uint8_t& b = p[i >> 1];
  b = (i & 1) ? uint8_t((b & 0x0F) | (code << 4)) : uint8_t((b & 0xF0) | (code & 0xF));
}

GPUEXT_HD uint32_t LoadScale(const void* scale, int32_t format, int64_t i) {
  if (HasF32Scale(format)) return static_cast<const uint32_t*>(scale)[i];
  return static_cast<const uint8_t*>(scale)[i];
}

GPUEXT_HD void StoreScale(void* scale, int32_t format, int64_t i, uint32_t s) {
  if (HasF32Scale(format)) {
    static_cast<uint32_t*>(scale)[i] = s;
  } else {
    static_cast<uint8_t*>(scale)[i] = uint8_t(s);
  }
}

GPUEXT_HD BitFormat OutputFormat(FloatType t) {
  return t == FloatType::kF32 ? F32Format() : (t == FloatType::kBF16 ? BF16Format() : F16Format());
}

GPUEXT_HD void StoreOutput(void* y, FloatType t, int64_t i, uint32_t bits) {
  if (t == FloatType::kF32) {
    static_cast<uint32_t*>(y)[i] = bits;
  } else {
    static_cast<uint16_t*>(y)[i] = uint16_t(bits);
  }
}

}  // namespace gpuext::formats
