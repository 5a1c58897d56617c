// Self-registration of FFI handlers. Each handler file says
//   GPUEXT_REGISTER_FFI_TARGET("gpuext_quantize", QuantizeFfi);
// and the module that links it (ffi/cpu_module.cc or ffi/cuda_module.cc) hands every
// registered target to Python, which calls jax.ffi.register_ffi_target once per entry.
// Multi-stage handlers register one symbol per stage ("instantiate", "prepare",
// "initialize", "execute"); Python receives them as a stage dict.
#pragma once

#include <map>
#include <string>

#include "xla/ffi/api/c_api.h"

namespace gpuext {

using StageMap = std::map<std::string, XLA_FFI_Handler*>;

// name -> stage -> handler. Filled during static initialisation of the module.
std::map<std::string, StageMap>& RegisteredTargets();

bool RegisterFfiTarget(const char* name, const char* stage, XLA_FFI_Handler* handler);

}  // namespace gpuext

#define GPUEXT_CONCAT_IMPL(a, b) a##b
#define GPUEXT_CONCAT(a, b) GPUEXT_CONCAT_IMPL(a, b)

#define GPUEXT_REGISTER_FFI_STAGE(name, stage, symbol)                              \
  static const bool GPUEXT_CONCAT(gpuext_registered_, __LINE__) [[maybe_unused]] = \
      ::gpuext::RegisterFfiTarget(name, stage, symbol)

#define GPUEXT_REGISTER_FFI_TARGET(name, symbol) GPUEXT_REGISTER_FFI_STAGE(name, "execute", symbol)
