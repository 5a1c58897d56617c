// jax_gpuext._cuda.cudnn_probe: what this GPU's cuDNN can build for a block-scaled matmul,
// asked directly (no custom call, nothing run). Used by benchmarks/probe_cudnn.py to record what
// cuDNN supports on a GPU our gates exclude (issue 4: the H100). Built only with the cuDNN dot.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <string>
#include <tuple>

#include "csrc/dot/cudnn_block_scaled.h"

namespace nb = nanobind;

namespace gpuext {

void AddCudnnProbe(nb::module_& m) {
  m.def(
      "cudnn_probe",
      [](const std::string& library, int64_t batch, int64_t rows_m, int64_t cols_n, int64_t k, int32_t lhs_type,
         int32_t rhs_type, int32_t out_type, bool fuse_alpha, bool drop_cublaslt_plans,
         int64_t workspace_limit) -> std::tuple<bool, std::string, int64_t> {
        if (lhs_type < 0 || lhs_type > 2 || rhs_type < 0 || rhs_type > 2 || out_type < 0 || out_type > 2)
          return {false, "element types must be 0..2 (E4M3, E5M2, E2M1), out 0..2 (bf16, f16, f32)", 0};
        CudnnBlockScaledMatmul p;
        p.batch = batch;
        p.m = rows_m;
        p.n = cols_n;
        p.k = k;
        p.lhs_type = static_cast<CudnnElement>(lhs_type);
        p.rhs_type = static_cast<CudnnElement>(rhs_type);
        p.out_type = static_cast<CudnnOut>(out_type);
        p.fuse_alpha = fuse_alpha;
        p.drop_cublaslt_plans = drop_cublaslt_plans;
        p.workspace_bytes = static_cast<size_t>(workspace_limit);
        int64_t ws = 0;
        nb::gil_scoped_release release;  // graph building can take a while
        const Status s = ProbeCudnnBlockScaledMatmul(library, p, &ws);
        return {s.ok(), s.ok() ? std::string() : s.message(), ws};
      },
      nb::arg("library"), nb::arg("batch"), nb::arg("m"), nb::arg("n"), nb::arg("k"), nb::arg("lhs_type"),
      nb::arg("rhs_type"), nb::arg("out_type"), nb::arg("fuse_alpha"), nb::arg("drop_cublaslt_plans"),
      nb::arg("workspace_limit"),
      "(supported, why not, workspace bytes) of the cuDNN graph for one block-scaled matmul");
}

}  // namespace gpuext
