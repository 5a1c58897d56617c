// jax_gpuext._cuda.ragged_dot_hopper_workspace_bytes: the size of the grouped Hopper kernel's
// workspace result, which jax_gpuext/ragged_dot/hopper.py computes too (a test keeps them equal).
#include <nanobind/nanobind.h>

#include <cstdint>

#include "csrc/ragged_dot/hopper_grouped.h"
#include "ffi/common/module_functions.h"

namespace nb = nanobind;

namespace gpuext {
namespace {

void AddRaggedDotHopper(nb::module_& m) {
  m.def(
      "ragged_dot_hopper_workspace_bytes",
      [](int64_t rows_m, int64_t groups) {
        return static_cast<int64_t>(hopper_grouped::WorkspaceBytes(rows_m, groups));
      },
      nb::arg("m"), nb::arg("groups"), "bytes of the grouped Hopper kernel's workspace, before the 256 bytes of slack");
}

}  // namespace

GPUEXT_REGISTER_MODULE_FUNCTIONS(AddRaggedDotHopper);

}  // namespace gpuext
