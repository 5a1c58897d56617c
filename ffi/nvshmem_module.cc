// jax_gpuext._nvshmem: the NVSHMEM all-reduce handlers and the bootstrap calls that
// jax_gpuext/distributed.py drives. Links libnvshmem_host.so.3; imported lazily.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <stdexcept>
#include <string>

#include "csrc/allreduce/nvshmem_allreduce.h"
#include "ffi/common/execute_stats_module.h"
#include "ffi/common/module_util.h"

namespace nb = nanobind;
namespace ar = gpuext::allreduce;

namespace {
// Python side of the module boundary: a failed Status becomes RuntimeError (nanobind
// translates std::runtime_error); handlers never throw.
void ThrowIfError(const gpuext::Status& s) {
  if (!s.ok()) throw std::runtime_error(s.message());
}
}  // namespace

NB_MODULE(_nvshmem, m) {
  m.def("registrations", &gpuext::RegistrationsDict);
  m.def("build_info", []() {
    nb::dict info;
    gpuext::AddCommonBuildInfo(info);
    info["platform"] = "cuda";
    info["nvshmem_version"] = GPUEXT_NVSHMEM_VERSION_STRING;
    return info;
  });
  // Capture counts of gpuext_all_reduce_graph (ffi/common/execute_stats.h).
  gpuext::AddExecuteStatsFunctions(m);
  m.def("init_status", &ar::InitStatus);
  m.def("get_uniqueid", []() {
    std::string id;
    ThrowIfError(ar::GetUniqueId(&id));
    return nb::bytes(id.data(), id.size());
  });
  m.def("initialize", [](int rank, int nranks, nb::bytes id, int device) {
    ThrowIfError(ar::InitializeWithUniqueId(rank, nranks, std::string(id.c_str(), id.size()), device));
  });
  m.def("attach", [](int device) { ThrowIfError(ar::AttachToExisting(device)); });
  m.def("allocate_workspace", [](int64_t bytes) { ThrowIfError(ar::AllocateWorkspace(bytes)); });
  m.def("free_workspace", &ar::FreeWorkspace);
  m.def("finalize", &ar::Finalize);
  m.def("my_pe", &ar::MyPe);
  m.def("n_pes", &ar::NPes);
  m.def("workspace_bytes", &ar::WorkspaceBytes);
  // Waits for all work on the device (CheckStatus(nullptr)) without the GIL: a running
  // program's host callbacks may need it to finish.
  m.def("check_status", []() { ThrowIfError(ar::CheckStatus(nullptr)); },
        nb::call_guard<nb::gil_scoped_release>());
}
