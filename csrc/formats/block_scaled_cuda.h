// CUDA launchers of the block-scaled kernels (csrc/formats/block_scaled_cuda.cu).
#pragma once

#include <cuda_runtime_api.h>

#include "csrc/formats/block_scaled.h"

namespace gpuext::formats {

Status QuantizeCuda(cudaStream_t stream, const QuantizeArgs& args);
Status DequantizeCuda(cudaStream_t stream, const DequantizeArgs& args);

}  // namespace gpuext::formats
