// CUDA runtime error checking for csrc/ code: a failed call becomes a Status that names
// the call, where it was made and the CUDA error string.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "csrc/common/status.h"

#define GPUEXT_CUDA_RETURN_IF_ERROR(expr)                                                 \
  do {                                                                                    \
    cudaError_t gpuext_cuda_err_ = (expr);                                                \
    if (gpuext_cuda_err_ != cudaSuccess)                                                  \
      return ::gpuext::Status::Error(std::string(GPUEXT_WHERE ": " #expr " failed: ") +     \
                                     cudaGetErrorName(gpuext_cuda_err_) + ": " +         \
                                     cudaGetErrorString(gpuext_cuda_err_));              \
  } while (0)

// After a kernel launch: launch-configuration errors surface here, not at the next call.
#define GPUEXT_CUDA_RETURN_IF_LAUNCH_ERROR(what) GPUEXT_CUDA_RETURN_IF_ERROR((what, cudaGetLastError()))
