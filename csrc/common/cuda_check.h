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

// After a kernel launch (`kernel` is a string literal naming it): launch-configuration errors
// surface here, attributed to that launch, not at the next unrelated CUDA call. cudaGetLastError
// also returns an error an earlier, unrelated kernel left (a sticky fault), so the message says
// "at or before".
#define GPUEXT_CUDA_RETURN_IF_LAUNCH_ERROR(kernel)                                            \
  do {                                                                                        \
    cudaError_t gpuext_cuda_err_ = cudaGetLastError();                                        \
    if (gpuext_cuda_err_ != cudaSuccess)                                                      \
      return ::gpuext::Status::Error(std::string(GPUEXT_WHERE ": CUDA error at or before the launch of " kernel ": ") + \
                                     cudaGetErrorName(gpuext_cuda_err_) + ": " +             \
                                     cudaGetErrorString(gpuext_cuda_err_));                  \
  } while (0)
