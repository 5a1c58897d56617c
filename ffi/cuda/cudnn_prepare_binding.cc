// jax_gpuext._cuda.cudnn_prepare: builds and caches the cuDNN graph of one block-scaled matmul on
// one GPU, asked from Python at trace time (jax_gpuext/dot_cudnn.py) and by
// benchmarks/probe_cudnn.py. No custom call, nothing run. Built only with the cuDNN dot.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <string>
#include <tuple>

#include "csrc/dot/cudnn_block_scaled.h"
#include "ffi/common/library_paths.h"
#include "ffi/common/module_functions.h"

namespace nb = nanobind;

namespace gpuext {
namespace {

void AddCudnnPrepare(nb::module_& m) {
  m.def(
      "cudnn_prepare",
      [](int device, int64_t batch, int64_t rows_m, int64_t cols_n, int64_t k, int32_t lhs_type, int32_t rhs_type,
         int32_t out_type, bool fuse_alpha, bool drop_cublaslt_plans,
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
        const std::string library = LibraryPath("cudnn");
        nb::gil_scoped_release release;  // graph building can take a while
        const Status s = PrepareCudnnBlockScaledMatmul(library, device, p, &ws);
        return {s.ok(), s.ok() ? std::string() : s.message(), ws};
      },
      nb::arg("device"), nb::arg("batch"), nb::arg("m"), nb::arg("n"), nb::arg("k"), nb::arg("lhs_type"),
      nb::arg("rhs_type"), nb::arg("out_type"), nb::arg("fuse_alpha"), nb::arg("drop_cublaslt_plans"),
      nb::arg("workspace_limit"),
      "(supported, why not, workspace bytes): build and cache the cuDNN graph of one block-scaled matmul "
      "on CUDA device `device` (-1: current), from the path set with set_library_path('cudnn', ...)");
}

}  // namespace

GPUEXT_REGISTER_MODULE_FUNCTIONS(AddCudnnPrepare);

}  // namespace gpuext
