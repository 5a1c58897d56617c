// NVSHMEM bootstrap with a unique id (no MPI): REFERENCE section 5.
#include <nvshmem.h>
#include <nvshmemx.h>

#include <cstring>
#include <string>

#include "csrc/allreduce/nvshmem_allreduce.h"
#include "csrc/allreduce/nvshmem_state.cuh"
#include "csrc/common/cuda_check.h"

namespace gpuext::allreduce {

static_assert(sizeof(nvshmemx_uniqueid_t) == kUniqueIdBytes, "NVSHMEM unique id size changed");

Workspace& GlobalWorkspace() {
  static Workspace ws;
  return ws;
}

int InitStatus() { return nvshmemx_init_status(); }

Status GetUniqueId(std::string* id) {
  nvshmemx_uniqueid_t uid = NVSHMEMX_UNIQUEID_INITIALIZER;
  if (int rc = nvshmemx_get_uniqueid(&uid); rc != 0)
    return Status::Error("nvshmemx_get_uniqueid returned " + std::to_string(rc));
  id->assign(reinterpret_cast<const char*>(&uid), sizeof(uid));
  return Status::Ok();
}

Status InitializeWithUniqueId(int rank, int nranks, const std::string& id, int device) {
  if (id.size() != sizeof(nvshmemx_uniqueid_t))
    return Status::Error("unique id must be " + std::to_string(sizeof(nvshmemx_uniqueid_t)) + " bytes");
  GPUEXT_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  nvshmemx_uniqueid_t uid;
  std::memcpy(&uid, id.data(), sizeof(uid));
  nvshmemx_init_attr_t attr = NVSHMEMX_INIT_ATTR_INITIALIZER;
  if (int rc = nvshmemx_set_attr_uniqueid_args(rank, nranks, &uid, &attr); rc != 0)
    return Status::Error("nvshmemx_set_attr_uniqueid_args returned " + std::to_string(rc));
  // The host library reports failure with a return code; the inline nvshmemx_init_attr would
  // exit(-1) instead. Once the host side is up, nvshmemx_init_attr only adds our device state.
  if (int rc = nvshmemx_hostlib_init_attr(NVSHMEMX_INIT_WITH_UNIQUEID, &attr); rc != 0)
    return Status::Error("nvshmemx_hostlib_init_attr returned " + std::to_string(rc) +
                         " (NVSHMEM_DEBUG=INFO says why; several processes on one GPU need CUDA MPS)");
  nvshmemx_init_attr(NVSHMEMX_INIT_WITH_UNIQUEID, &attr);
  return Status::Ok();
}

Status AttachToExisting(int device) {
  GPUEXT_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  if (nvshmemx_init_status() < NVSHMEM_STATUS_IS_INITIALIZED)
    return Status::Error("NVSHMEM is not initialized by another library");
  // Host state exists; this initializes the device-side state of our libnvshmem_device copy.
  nvshmemx_init_attr(0, nullptr);
  return Status::Ok();
}

Status AllocateWorkspace(int64_t data_bytes) {
  Workspace& ws = GlobalWorkspace();
  if (ws.ctl != nullptr) return Status::Ok();
  ws.my_pe = nvshmem_my_pe();
  ws.n_pes = nvshmem_n_pes();
  if (ws.n_pes > kMaxPes) return Status::Error("at most " + std::to_string(kMaxPes) + " PEs supported");
  const size_t ctl_bytes = (sizeof(Control) + 255) / 256 * 256;
  void* base = nvshmem_malloc(ctl_bytes + static_cast<size_t>(data_bytes));  // collective
  if (base == nullptr)
    return Status::Error("nvshmem_malloc(" + std::to_string(ctl_bytes + data_bytes) +
                         ") failed: raise NVSHMEM_SYMMETRIC_SIZE or lower the workspace");
  GPUEXT_CUDA_RETURN_IF_ERROR(cudaMemset(base, 0, ctl_bytes));
  GPUEXT_CUDA_RETURN_IF_ERROR(cudaMallocHost(&ws.host_ctl, sizeof(Control)));
  GPUEXT_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  nvshmem_barrier_all();  // no PE may signal into a peer's control block before it is zeroed
  ws.ctl = static_cast<Control*>(base);
  ws.data = static_cast<unsigned char*>(base) + ctl_bytes;
  ws.data_bytes = data_bytes;
  return Status::Ok();
}

void FreeWorkspace() {
  Workspace& ws = GlobalWorkspace();
  if (ws.ctl == nullptr) return;
  nvshmem_barrier_all();
  nvshmem_free(ws.ctl);
  cudaFreeHost(ws.host_ctl);
  ws = Workspace{};
}

void Finalize() { nvshmem_finalize(); }
int MyPe() { return nvshmem_my_pe(); }
int NPes() { return nvshmem_n_pes(); }
int64_t WorkspaceBytes() { return GlobalWorkspace().data_bytes; }

}  // namespace gpuext::allreduce
