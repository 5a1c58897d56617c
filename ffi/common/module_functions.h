// Self-registration of extra Python functions of a nanobind module, the way handlers register
// themselves (registry.h): an optional part of _cuda (the cuBLASLt or cuDNN dot) adds its
// functions with GPUEXT_REGISTER_MODULE_FUNCTIONS(AddMyFunctions) and the module definition calls
// AddRegisteredModuleFunctions(m), so it needs no #ifdef per optional part.
#pragma once

#include <nanobind/nanobind.h>

#include <vector>

namespace gpuext {

using ModuleFunctionAdder = void (*)(nanobind::module_&);

inline std::vector<ModuleFunctionAdder>& ModuleFunctionAdders() {
  static auto* adders = new std::vector<ModuleFunctionAdder>();  // filled during static init
  return *adders;
}

inline bool RegisterModuleFunctions(ModuleFunctionAdder add) {
  ModuleFunctionAdders().push_back(add);
  return true;
}

inline void AddRegisteredModuleFunctions(nanobind::module_& m) {
  for (ModuleFunctionAdder add : ModuleFunctionAdders()) add(m);
}

}  // namespace gpuext

#define GPUEXT_MODULE_FN_CONCAT_IMPL(a, b) a##b
#define GPUEXT_MODULE_FN_CONCAT(a, b) GPUEXT_MODULE_FN_CONCAT_IMPL(a, b)
#define GPUEXT_REGISTER_MODULE_FUNCTIONS(adder)                                                  \
  static const bool GPUEXT_MODULE_FN_CONCAT(gpuext_module_fns_, __LINE__) [[maybe_unused]] = \
      ::gpuext::RegisterModuleFunctions(adder)
