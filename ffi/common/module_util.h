// What both nanobind modules hand to Python: the registered targets as capsules and a
// description of how the module was built.
#pragma once

#include <nanobind/nanobind.h>

#include "ffi/common/registry.h"
#include "xla/ffi/api/c_api.h"

namespace gpuext {

inline nanobind::dict RegistrationsDict() {
  namespace nb = nanobind;
  nb::dict out;
  for (const auto& [name, stages] : RegisteredTargets()) {
    auto capsule = [](XLA_FFI_Handler* h) { return nb::capsule(reinterpret_cast<void*>(h)); };
    if (stages.size() == 1 && stages.count("execute")) {
      out[name.c_str()] = capsule(stages.at("execute"));
    } else {
      nb::dict by_stage;
      for (const auto& [stage, handler] : stages) by_stage[stage.c_str()] = capsule(handler);
      out[name.c_str()] = by_stage;
    }
  }
  return out;
}

inline void AddCommonBuildInfo(nanobind::dict& info) {
  info["ffi_api_major"] = XLA_FFI_API_MAJOR;
  info["ffi_api_minor"] = XLA_FFI_API_MINOR;
  info["compiler"] = __VERSION__;
}

}  // namespace gpuext
