// jax_gpuext._cuda.cublaslt_prepare: creates the cuBLASLt handle of one GPU and asks the heuristic
// for one matmul's algorithm, caching both for the handler (csrc/dot/cublaslt_block_scaled.h).
// Called from Python at trace time (jax_gpuext/dot_cublaslt.py). Also cublaslt_plan_stats, for the
// tests. Built only with the cuBLASLt dot.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <string>
#include <tuple>

#include "csrc/dot/cublaslt_block_scaled.h"
#include "ffi/common/library_paths.h"
#include "ffi/common/module_functions.h"

namespace nb = nanobind;

namespace gpuext {
namespace {

void AddCublasLtPrepare(nb::module_& m) {
  m.def(
      "cublaslt_prepare",
      [](int device, int64_t rows_m, int64_t cols_n, int64_t k, int32_t lhs_type, int32_t rhs_type,
         int32_t out_type, int32_t lhs_scale_mode, int32_t rhs_scale_mode,
         int64_t workspace_bytes) -> std::tuple<bool, std::string> {
        BlockScaledMatmul p;
        if (!ElementTypeOfCode(lhs_type, &p.lhs_type) || !ElementTypeOfCode(rhs_type, &p.rhs_type) ||
            !OutTypeOfCode(out_type, &p.out_type))
          return {false, "element types must be 0..2 (E4M3, E5M2, E2M1), out 0..2 (bf16, f16, f32)"};
        p.m = rows_m;
        p.n = cols_n;
        p.k = k;
        p.lhs_scale_mode = lhs_scale_mode;
        p.rhs_scale_mode = rhs_scale_mode;
        p.workspace_bytes = static_cast<size_t>(workspace_bytes);
        const std::string library = LibraryPath("cublaslt");
        nb::gil_scoped_release release;
        const Status s = PrepareBlockScaledMatmul(library, device, p);
        return {s.ok(), s.ok() ? std::string() : s.message()};
      },
      nb::arg("device"), nb::arg("m"), nb::arg("n"), nb::arg("k"), nb::arg("lhs_type"), nb::arg("rhs_type"),
      nb::arg("out_type"), nb::arg("lhs_scale_mode"), nb::arg("rhs_scale_mode"), nb::arg("workspace_bytes"),
      "(supported, why not): cache the cuBLASLt handle and algorithm of one matmul on CUDA device `device` "
      "(-1: current), from the path set with set_library_path('cublaslt', ...)");
  m.def(
      "cublaslt_plan_stats",
      []() -> std::tuple<int64_t, int64_t> {
        const CublasLtPlanStats s = GetCublasLtPlanStats();
        return {s.plans, s.built_while_running};
      },
      "(plans cached, plans the execute path had to make): the second is 0 when trace time or the handler's "
      "initialize stage prepared every call");
}

}  // namespace

GPUEXT_REGISTER_MODULE_FUNCTIONS(AddCublasLtPrepare);

}  // namespace gpuext
