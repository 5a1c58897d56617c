// Block-scaled quantize / dequantize entry points: raw pointers, sizes, a stream, a Status.
// The array is viewed as [outer, K, inner] with blocks of `block` along K (1-D formats) or as
// [outer, M, N] with 128x128 tiles (FP8_128x128, `inner` == 1, K == M, `cols` == N).
// FP8_TENSOR is [outer, K] with one block of K (`inner` == 1, `block` == max(K, 1)): `outer`
// counts the tensors (vmap's batch), each with one scale, even when K == 0.
// `global_scale` holds `global_count` fp32 values, one per run of outer / global_count leading
// rows (vmap batch dims come first). FP4 elements are one per byte (low nibble) unless
// `fp4_packed`, then two per byte, element 2i in the low nibble (the one place that decides).
#pragma once

#include <cstdint>

#include "csrc/common/parallel.h"
#include "csrc/common/status.h"
#include "csrc/formats/block_scaled_math.h"

namespace gpuext::formats {

struct BlockScaledGeometry {
  int32_t format = kMxfp8E4m3;
  int64_t outer = 1, k = 1, inner = 1;  // 1-D formats
  int64_t cols = 1;                     // FP8_128x128: N (then k is M and inner is 1)
  int64_t block = 32;                   // 1-D block length
  int64_t global_count = 1;
  bool fp4_packed = false;

  GPUEXT_HD bool two_d() const { return format == kFp8Blockwise128x128; }
  GPUEXT_HD bool per_tensor() const { return format == kFp8PerTensor; }
  GPUEXT_HD int64_t elements() const { return two_d() ? outer * k * cols : outer * k * inner; }
  GPUEXT_HD int64_t blocks_along() const {
    if (per_tensor()) return 1;
    return (k + (two_d() ? 128 : block) - 1) / (two_d() ? 128 : block);
  }
  GPUEXT_HD int64_t block_cols() const { return (cols + 127) / 128; }
};

struct QuantizeArgs {
  BlockScaledGeometry geo;
  int32_t scale_rounding = kRoundUp;
  FloatType in_type = FloatType::kF32;
  const void* x = nullptr;
  const float* global_scale = nullptr;
  void* data = nullptr;   // element codes (uint8, or packed FP4)
  void* scale = nullptr;  // uint8 codes or fp32
};

struct DequantizeArgs {
  BlockScaledGeometry geo;
  FloatType out_type = FloatType::kF32;
  const void* data = nullptr;
  const void* scale = nullptr;
  const float* global_scale = nullptr;
  void* y = nullptr;
};

// The compiled copy of the CPU kernels this CPU runs, e.g. "x86-64-v3 (AVX2)": the loader picks
// one of the clones (block_scaled_cpu_kernels.h) by the CPU; `info` and CI print it.
const char* CpuKernelClone();

// CPU: large arrays are split across `runner`'s threads (none: the calling thread only).
Status QuantizeCpu(const QuantizeArgs& args, const TaskRunner* runner = nullptr);
Status DequantizeCpu(const DequantizeArgs& args, const TaskRunner* runner = nullptr);

}  // namespace gpuext::formats
