// jax_gpuext._cpu: hands the CPU handlers to Python. Handlers live in ffi/cpu/*.cc.
#include <nanobind/nanobind.h>

#include "csrc/formats/block_scaled.h"
#include "ffi/common/module_util.h"

NB_MODULE(_cpu, m) {
  m.def("registrations", &gpuext::RegistrationsDict);
  m.def("build_info", []() {
    nanobind::dict info;
    gpuext::AddCommonBuildInfo(info);
    info["platform"] = "cpu";
    info["cpu_kernels"] = gpuext::formats::CpuKernelClone();
    return info;
  });
}
