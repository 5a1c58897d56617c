// jax_gpuext._cuda: hands the CUDA handlers to Python and answers questions about the
// CUDA build and the driver. Handlers live in ffi/cuda/*.cc; kernels in csrc/.
#include <cuda_runtime_api.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <stdexcept>
#include <vector>

#include "csrc/timer/event_table.h"
#include "ffi/common/execute_stats_module.h"
#include "ffi/common/library_paths.h"
#include "ffi/common/module_functions.h"
#include "ffi/common/module_util.h"

namespace nb = nanobind;

NB_MODULE(_cuda, m) {
  m.def("registrations", &gpuext::RegistrationsDict);
  m.def("build_info", []() {
    nb::dict info;
    gpuext::AddCommonBuildInfo(info);
    info["platform"] = "cuda";
    info["cuda_version"] = GPUEXT_CUDA_VERSION_STRING;
    info["cuda_runtime_version"] = CUDART_VERSION;  // e.g. 13000
    info["architectures"] = GPUEXT_CUDA_ARCHITECTURES;
    return info;
  });
  // Driver API version (e.g. 13000) or 0 when no driver is installed: never raises, so
  // `capabilities()` works on a machine without a GPU.
  m.def("driver_version", []() {
    int version = 0;
    return cudaDriverGetVersion(&version) == cudaSuccess ? version : 0;
  });
  // Where the cuBLASLt / cuDNN handlers dlopen their library from (ffi/common/library_paths.h).
  m.def("set_library_path", &gpuext::SetLibraryPath, nb::arg("name"), nb::arg("path"));
  m.def("library_path", [](const std::string& name) { return gpuext::LibraryPath(name); }, nb::arg("name"));
  // execute_stats / reset_execute_stats / set_execute_stats_enabled: whether XLA captured our
  // command-buffer-compatible calls into CUDA graphs (ffi/common/execute_stats.h).
  gpuext::AddExecuteStatsFunctions(m);
  // Functions of optional parts (cudnn_probe, cublaslt_prepare), when they were built.
  gpuext::AddRegisteredModuleFunctions(m);
  // The benchmarks' device timer (gpuext_timer_mark, ffi/cuda/timer.cc; benchmarks/_devtime.py):
  // the slots' events, read after the timed calls completed.
  m.def(
      "timer_elapsed_ms",
      [](int64_t start_slot, int64_t end_slot, int64_t shift) {
        std::vector<float> out;
        gpuext::Status s;
        {
          nb::gil_scoped_release release;  // waits for the events
          s = gpuext::TimerElapsedMs(start_slot, end_slot, shift, &out);
        }
        if (!s.ok()) throw std::runtime_error(s.message());
        return out;
      },
      nb::arg("start_slot"), nb::arg("end_slot"), nb::arg("shift") = 0,
      "[ms from entry i of start_slot to entry i + shift of end_slot, for each i where both exist]");
  m.def(
      "timer_reset",
      [](int64_t slot) {
        const gpuext::Status s = gpuext::TimerReset(slot);
        if (!s.ok()) throw std::runtime_error(s.message());
      },
      nb::arg("slot") = -1, "forget the entries of a timer slot (-1: every slot)");
  m.def(
      "timer_count",
      [](int64_t slot) {
        int64_t n = 0;
        const gpuext::Status s = gpuext::TimerCount(slot, &n);
        if (!s.ok()) throw std::runtime_error(s.message());
        return n;
      },
      nb::arg("slot"), "entries recorded in a timer slot since its last reset");
  m.def("device_count", []() {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
  });
}
