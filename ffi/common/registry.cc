#include "ffi/common/registry.h"

namespace gpuext {

std::map<std::string, StageMap>& RegisteredTargets() {
  // Function-local static: safe to use from other translation units' static initialisers.
  static auto* targets = new std::map<std::string, StageMap>();
  return *targets;
}

bool RegisterFfiTarget(const char* name, const char* stage, XLA_FFI_Handler* handler) {
  RegisteredTargets()[name][stage] = handler;
  return true;
}

}  // namespace gpuext
