// CUDA launchers of the block-scaled kernels (csrc/formats/block_scaled_cuda.cu).
#pragma once

#include <cuda_runtime_api.h>

#include "csrc/formats/block_scaled.h"

namespace gpuext::formats {

Status QuantizeCuda(cudaStream_t stream, const QuantizeArgs& args);
Status DequantizeCuda(cudaStream_t stream, const DequantizeArgs& args);
// quantize_both_axes: x quantized along its last axis (`last`) and its second-to-last (`second`), both
// decoded from the same x; one read of x where the fused kernel takes the layout, else two passes.
Status QuantizeBothAxesCuda(cudaStream_t stream, const QuantizeArgs& last, const QuantizeArgs& second);

}  // namespace gpuext::formats
