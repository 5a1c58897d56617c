// Makes a CUDA device current for a scope and restores the previous one. Trace-time preparation
// (plans, graphs) is called from Python for each local GPU, on a thread whose current device
// belongs to JAX; it must leave that as it found it.
#pragma once

#include <cuda_runtime_api.h>

#include "csrc/common/cuda_check.h"
#include "csrc/common/status.h"

namespace gpuext {

class ScopedDevice {
 public:
  ScopedDevice() = default;
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  ~ScopedDevice() {
    if (restore_) cudaSetDevice(previous_);
  }

  // device < 0: keep the current device. On return *current is the device now current.
  Status Enter(int device, int* current) {
    GPUEXT_CUDA_RETURN_IF_ERROR(cudaGetDevice(&previous_));
    if (device >= 0 && device != previous_) {
      GPUEXT_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
      restore_ = true;
    }
    *current = device >= 0 ? device : previous_;
    return Status::Ok();
  }

 private:
  int previous_ = 0;
  bool restore_ = false;
};

}  // namespace gpuext
