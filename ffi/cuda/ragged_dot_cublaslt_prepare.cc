// jax_gpuext._cuda functions of the grouped cuBLASLt dot (jax_gpuext/ragged_dot/cublaslt.py):
// cublaslt_grouped_prepare (trace time: the handle and the algorithm, cached for the handler),
// cublaslt_grouped_workspace_bytes (the size the workspace result must have, which Python
// computes too: a test keeps the two in step) and cublaslt_grouped_plan_stats (for the tests).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <string>
#include <tuple>

#include "csrc/ragged_dot/cublaslt_grouped.h"
#include "ffi/common/library_paths.h"
#include "ffi/common/module_functions.h"

namespace nb = nanobind;

namespace gpuext {
namespace {

// Output codes as jax_gpuext/dot.py OUT_CODES: 0 bf16, 2 f32 (f16 is not taken here).
bool GroupedOutType(int32_t code, GroupedMatmul* p) {
  switch (code) {
    case 0: p->out_type = CUDA_R_16BF; p->gemm.out_elem_bytes = 2; return true;
    case 2: p->out_type = CUDA_R_32F; p->gemm.out_elem_bytes = 4; return true;
    default: return false;
  }
}

GroupedMatmul Problem(int64_t m, int64_t n, int64_t k, int64_t groups, int32_t row_align) {
  GroupedMatmul p;
  p.gemm.m = m;
  p.gemm.n = n;
  p.gemm.k = k;
  p.gemm.groups = groups;
  p.gemm.row_align = row_align;
  return p;
}

void AddGroupedCublasLt(nb::module_& m) {
  m.def(
      "cublaslt_grouped_prepare",
      [](int device, int64_t rows_m, int64_t cols_n, int64_t k, int64_t groups, int32_t out_type,
         int32_t rhs_scale_mode, int32_t row_align) -> std::tuple<bool, std::string> {
        GroupedMatmul p = Problem(rows_m, cols_n, k, groups, row_align);
        if (!GroupedOutType(out_type, &p)) return {false, "out_type must be 0 (bfloat16) or 2 (float32)"};
        p.rhs_scale_mode = rhs_scale_mode;
        const std::string library = LibraryPath("cublaslt");
        nb::gil_scoped_release release;
        const Status s = PrepareGroupedMatmul(library, device, p);
        return {s.ok(), s.ok() ? std::string() : s.message()};
      },
      nb::arg("device"), nb::arg("m"), nb::arg("n"), nb::arg("k"), nb::arg("groups"), nb::arg("out_type"),
      nb::arg("rhs_scale_mode"), nb::arg("row_align"),
      "(supported, why not): cache the cuBLASLt handle and grouped algorithm of one ragged dot on CUDA device "
      "`device` (-1: current), from the path set with set_library_path('cublaslt', ...)");
  m.def(
      "cublaslt_grouped_workspace_bytes",
      [](int64_t rows_m, int64_t cols_n, int64_t k, int64_t groups, int32_t row_align, int64_t out_itemsize) {
        GroupedMatmul p = Problem(rows_m, cols_n, k, groups, row_align);
        p.gemm.out_elem_bytes = static_cast<size_t>(out_itemsize);
        return static_cast<int64_t>(GroupedWorkspaceBytes(p.gemm));
      },
      nb::arg("m"), nb::arg("n"), nb::arg("k"), nb::arg("groups"), nb::arg("row_align"), nb::arg("out_itemsize"),
      "bytes of the grouped dot's workspace result, before the 256 bytes of alignment slack");
  m.def(
      "cublaslt_grouped_plan_stats",
      []() -> std::tuple<int64_t, int64_t> {
        const GroupedPlanStats s = GetGroupedPlanStats();
        return {s.plans, s.built_while_running};
      },
      "(grouped plans cached, plans the execute path had to make)");
}

}  // namespace

GPUEXT_REGISTER_MODULE_FUNCTIONS(AddGroupedCublasLt);

}  // namespace gpuext
