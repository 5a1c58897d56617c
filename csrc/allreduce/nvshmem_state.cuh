// The symmetric workspace, shared by nvshmem_bootstrap.cu and nvshmem_allreduce.cu.
#pragma once

#include <cstdint>

#include "csrc/allreduce/nvshmem_allreduce.h"

namespace gpuext::allreduce {

// Control block at the start of the symmetric workspace, identical on every PE. Flags live
// in the reader's memory and are written by peers (put-with-signal / signal_op), so every
// wait spins on local memory. `epoch` is bumped by the kernels themselves: a replayed CUDA
// graph advances it like an eager call, and no host state changes per call.
struct Control {
  uint64_t posted[kMaxPes];    // [s]: PE s's phase-1 data for epoch e is here
  uint64_t gathered[kMaxPes];  // [s]: PE s's reduced segment (two_shot) is here
  uint64_t consumed[kMaxPes];  // [p]: PE p has read what this PE wrote for epoch e
  uint64_t epoch;              // last completed epoch of this PE
  uint32_t arrived[2];         // blocks of the running kernel past a grid-wide step
  // Sticky status: 0 ok, else kPeersMissing / kGridStalled bits; `missing` has bit s for
  // every PE not seen in time.
  uint32_t status;
  uint32_t pad;
  unsigned long long missing;
  uint64_t timeout_epoch;
};

// Control::status bits: why a deadline passed.
constexpr uint32_t kPeersMissing = 1;  // PEs in `missing` did not signal
constexpr uint32_t kGridStalled = 2;   // every peer signalled, but blocks of this PE's kernel
                                       // never reached its grid-wide step (not co-resident)

struct Workspace {
  Control* ctl = nullptr;        // symmetric (nvshmem_malloc)
  unsigned char* data = nullptr;  // symmetric, `data_bytes` per PE, right after ctl
  // Symmetric, `data_bytes` per PE, after data: nvshmem_library's staging (in | out halves).
  // Apart from `data` because peers' kernels write into `data` as soon as this PE's consumed
  // signal allows, which the library's stream order on this PE knows nothing about.
  unsigned char* library = nullptr;
  int64_t data_bytes = 0;
  Control* host_ctl = nullptr;   // pinned host copy for CheckStatus
  int my_pe = 0, n_pes = 1;
};

Workspace& GlobalWorkspace();

}  // namespace gpuext::allreduce
