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

namespace {

// After any initialization: is NVSHMEM usable by our kernels and the library collectives?
Status CheckInitStatus() {
  const int st = nvshmemx_init_status();
  // nvshmemx_hostlib_init_attr returns 0 even when NVSHMEM's common init (transports, heap,
  // MPS) failed; the next NVSHMEM host call would then exit(-1).
  if (st < NVSHMEM_STATUS_IS_INITIALIZED)
    return Status::Error("NVSHMEM initialization did not complete (nvshmemx_init_status() = " + std::to_string(st) +
                         "); run with NVSHMEM_DEBUG=INFO to see which step failed");
  // Limited MPG: PEs sharing a GPU are time-sliced, so our kernels' spins would time out, and
  // every nvshmemx_*_reduce_on_stream calls exit(-1).
  if (st == NVSHMEM_STATUS_LIMITED_MPG)
    return Status::Error(
        "NVSHMEM has only limited multi-process-per-GPU support: several PEs share a GPU, but CUDA MPS is not "
        "running for them or their CUDA_MPS_ACTIVE_THREAD_PERCENTAGE values sum to more than 100. Start the MPS "
        "daemon (nvidia-cuda-mps-control -d) for these processes and keep the sum <= 100, or set "
        "NVSHMEM_IGNORE_CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=1 (NVSHMEM_DEBUG=INFO shows what NVSHMEM detected)");
  return Status::Ok();
}

// The local part of AllocateWorkspace: the pinned host copy of Control, the zeroed Control.
Status PrepareLocal(Workspace& ws, void* base, size_t ctl_bytes) {
  GPUEXT_CUDA_RETURN_IF_ERROR(cudaMallocHost(&ws.host_ctl, sizeof(Control)));
  GPUEXT_CUDA_RETURN_IF_ERROR(cudaMemset(base, 0, ctl_bytes));
  GPUEXT_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return Status::Ok();
}

}  // namespace

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
  GPUEXT_RETURN_IF_ERROR(CheckInitStatus());
  nvshmemx_init_attr(NVSHMEMX_INIT_WITH_UNIQUEID, &attr);
  return Status::Ok();
}

Status AttachToExisting(int device) {
  GPUEXT_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  GPUEXT_RETURN_IF_ERROR(CheckInitStatus());
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
  const size_t bytes = ctl_bytes + 2 * static_cast<size_t>(data_bytes);  // ctl | data | library
  void* base = nvshmem_malloc(bytes);  // collective
  // A local failure is returned only after the barrier: every PE must reach it, or the
  // others wait there forever.
  const Status local = base == nullptr ? Status::Error("nvshmem_malloc(" + std::to_string(bytes) +
                                                       ") failed: raise NVSHMEM_SYMMETRIC_SIZE or lower the workspace")
                                       : PrepareLocal(ws, base, ctl_bytes);
  nvshmem_barrier_all();  // no PE may signal into a peer's control block before it is zeroed
  if (!local.ok()) return local;
  ws.ctl = static_cast<Control*>(base);
  ws.data = static_cast<unsigned char*>(base) + ctl_bytes;
  ws.library = ws.data + data_bytes;
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

void Finalize() {
  nvshmem_finalize();
  // Pairs our nvshmemx_hostlib_init_attr: NVSHMEM counts it as a separate initialization and
  // tears down (proxy thread, heap, teams) only when the count reaches zero.
  nvshmemx_hostlib_finalize();
}
int MyPe() { return nvshmem_my_pe(); }
int NPes() { return nvshmem_n_pes(); }
int64_t WorkspaceBytes() { return GlobalWorkspace().data_bytes; }

}  // namespace gpuext::allreduce
