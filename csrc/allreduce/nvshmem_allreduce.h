// NVSHMEM all-reduce for one GPU per process: bootstrap, the symmetric workspace and the
// launches. Raw pointers, a stream, a Status; no XLA, no nanobind, no NVSHMEM types here
// (the .cu files include NVSHMEM; this header is included by g++-compiled handlers).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "csrc/allreduce/reduce_ops.h"
#include "csrc/common/status.h"

namespace gpuext::allreduce {

constexpr int kUniqueIdBytes = 128;  // sizeof(nvshmemx_uniqueid_t), checked in the .cu
constexpr int kMaxPes = 64;          // one bit per PE in the status word's missing mask

// --- bootstrap (nvshmem_bootstrap.cu) -----------------------------------------------
int InitStatus();  // nvshmemx_init_status(): 0 not initialized .. 4 full MPG
Status GetUniqueId(std::string* id);  // rank 0 only; 128 bytes
// nvshmemx_hostlib_init_attr first (returns an error code), then nvshmemx_init_attr, which
// also initializes the device state of our copy of libnvshmem_device and would exit(-1) on
// failure: by then the host library is known to be up. Both this and AttachToExisting refuse
// an NVSHMEM that is not fully initialized or has only limited multi-process-per-GPU support.
Status InitializeWithUniqueId(int rank, int nranks, const std::string& id, int device);
Status AttachToExisting(int device);  // another library initialized NVSHMEM first
// Collective; flags (zeroed) + kernel data + library staging, `data_bytes` each.
Status AllocateWorkspace(int64_t data_bytes);
void FreeWorkspace();  // collective
void Finalize();       // collective; only after InitializeWithUniqueId
int MyPe();
int NPes();
int64_t WorkspaceBytes();

// --- the collective (nvshmem_allreduce.cu) --------------------------------------------
struct NvshmemAllReduceArgs {
  const void* in = nullptr;
  void* out = nullptr;
  int64_t count = 0;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  Algorithm algorithm = Algorithm::kOneShot;
  double timeout_s = 30.0;
  // true: copy the device status word back and synchronize the stream, so a timeout is an
  // error of this call (not command-buffer compatible). false: only kernels on `stream`; a
  // timeout stays in the sticky status word and fails the next checked call / CheckStatus.
  bool checked = true;
};

Status LaunchAllReduce(const NvshmemAllReduceArgs& args, cudaStream_t stream);
// Reads the sticky status word (synchronizes `stream`): an error naming the missing PEs.
// stream == nullptr (Python's check_status) first waits for all work on the device.
Status CheckStatus(cudaStream_t stream);

}  // namespace gpuext::allreduce
