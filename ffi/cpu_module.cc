// jax_gpuext._cpu: hands the CPU handlers to Python. Handlers live in ffi/cpu/*.cc.
#include <nanobind/nanobind.h>

#include "csrc/allreduce/cpu_protocol.h"
#include "csrc/formats/block_scaled.h"
#include "ffi/common/module_util.h"

NB_MODULE(_cpu, m) {
  m.def("registrations", &gpuext::RegistrationsDict);
  // The CPU all-reduce protocol's live state, for tests: its heaps exist only while a call is in
  // flight (csrc/allreduce/cpu_protocol.h), so between calls this is zero groups and zero bytes.
  m.def("allreduce_cpu_state", []() {
    const gpuext::allreduce::CpuAllReduceState s = gpuext::allreduce::CpuAllReduceLiveState();
    nanobind::dict d;
    d["live_groups"] = s.live_groups;
    d["heap_bytes"] = s.heap_bytes;
    d["failed_groups"] = s.failed_groups;
    return d;
  });
  m.def("build_info", []() {
    nanobind::dict info;
    gpuext::AddCommonBuildInfo(info);
    info["platform"] = "cpu";
    info["cpu_kernels"] = gpuext::formats::CpuKernelClone();
    return info;
  });
}
