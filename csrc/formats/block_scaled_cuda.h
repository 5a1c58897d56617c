// CUDA launchers of the block-scaled kernels (csrc/formats/block_scaled_cuda.cu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "csrc/formats/block_scaled.h"

namespace gpuext::formats {

Status QuantizeCuda(cudaStream_t stream, const QuantizeArgs& args);
Status DequantizeCuda(cudaStream_t stream, const DequantizeArgs& args);
// quantize_both_axes: x quantized along its last axis (`last`) and its second-to-last (`second`), both
// decoded from the same x; one read of x where the fused kernel takes the layout, else two passes
// (`fused`, where given, says which ran).
Status QuantizeBothAxesCuda(cudaStream_t stream, const QuantizeArgs& last, const QuantizeArgs& second,
                            bool* fused = nullptr);

// The weight gradient's operands (jax_gpuext/ragged_dot/grouped.py, quantize_tokens_for_wgrad): x
// [m, cols] (tokens first) in FP8_1x128 along the tokens, blocks restarting at each group, written
// into the padded slot layout transposed: codes [cols, 128 * blocks] E4M3, scales [blocks, cols]
// fp32; slot block j holds rows table[2j] .. table[2j] + table[2j + 1] - 1 of x (at most 128; zeros
// after). One pass (csrc/formats/token_slots_kernel.cuh). cols % 8 (16-bit x) or % 4 (f32) == 0 and
// 16-byte aligned buffers, else an error (the caller's gate sends no other).
struct TokenSlotsArgs {
  FloatType in_type = FloatType::kBF16;
  const void* x = nullptr;
  const int32_t* table = nullptr;
  int64_t m = 0, cols = 0, blocks = 0;
  int32_t scale_rounding = kRoundUp;
  void* data = nullptr;
  void* scale = nullptr;
};
Status QuantizeTokenSlotsCuda(cudaStream_t stream, const TokenSlotsArgs& args);

// Kernel-only timing (issue 35, round 2; docs/design.md): the device time of the launchers above on
// buffers of their own, CUDA events around `reps` back-to-back calls (best of `rounds`), beside a
// device-to-device cudaMemcpyAsync of x timed the same way in the same process -- no XLA program, no
// loop around the op. `args.x` is a HOST pointer to the input; every other pointer of `args` is
// ignored (device buffers are allocated here and freed before returning). With `last` (its x, too,
// ignored) quantize_both_axes is timed as well: `args` is then the axis -2 geometry of the same x.
// The outputs of the last calls come back for a bit-exactness check.
struct KernelTimes {
  double quantize_s = 0, dequantize_s = 0, both_s = 0, copy_s = 0;  // per call
  bool both_fused = false;  // quantize_both_axes ran the fused kernel (else the two axes apart)
  std::vector<uint8_t> data, scale, y;                              // quantize, dequantize (to x's type)
  std::vector<uint8_t> both_data_last, both_scale_last, both_data_second, both_scale_second;
};
Status TimeKernelsCuda(const QuantizeArgs& args, const QuantizeArgs* last, float global_scale, int reps, int rounds,
                       KernelTimes* out);

}  // namespace gpuext::formats
