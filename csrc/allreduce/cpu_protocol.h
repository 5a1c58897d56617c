// The one-shot and two-shot all-reduce protocols of the NVSHMEM kernels, run between the
// threads that XLA's CPU runtime uses for its host devices. A process-local "symmetric
// heap" stands in for NVSHMEM's: one workspace per rank, flags that a writer sets in the
// reader's memory, epoch counters that only grow. Same chunking, same epochs, same
// timeout-and-name-the-missing-peers behaviour, so CI tests the protocol against lax.psum.
#pragma once

#include <cstdint>

#include "csrc/allreduce/reduce_ops.h"
#include "csrc/common/status.h"

namespace gpuext::allreduce {

struct CpuAllReduceArgs {
  const void* in = nullptr;
  void* out = nullptr;
  int64_t count = 0;  // elements
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  Algorithm algorithm = Algorithm::kOneShot;
  int rank = 0;        // this caller's index in the group
  int group_size = 1;  // ranks in the group
  int64_t site = 0;    // call site: one heap per (site, color), see cpu_protocol.cc
  int64_t color = 0;   // which group, when a mesh has several along the reduced axis
  int64_t workspace_bytes = 0;  // per rank; messages larger than a chunk are split
  double timeout_s = 30.0;
  // Which execution of the program this call belongs to (XLA's RunId, shared by every device of
  // one execution) and which device makes it (-1: unknown, the rank-claim check below is skipped).
  int64_t run_id = 0;
  int64_t device = -1;
};

// Blocks until every rank of the group has called it with the same site/color, or until the
// timeout; then returns an error naming the ranks that did not arrive. A group that timed out
// stays failed (its epochs can no longer agree): later calls at that site fail at once. Two
// devices that claim the same rank in one execution fail the group too, naming the rank and
// color; so do two callers inside at once with the same rank. A group's heap lives only while one
// of its ranks is inside a call.
Status CpuAllReduce(const CpuAllReduceArgs& args);

// What the protocol holds right now (tests check that it returns to zero between calls).
struct CpuAllReduceState {
  int64_t live_groups = 0;    // groups with a rank inside a call
  int64_t heap_bytes = 0;     // their workspaces, all ranks together
  int64_t failed_groups = 0;  // failed groups remembered (an error string each, no heap)
};
CpuAllReduceState CpuAllReduceLiveState();

// Elements per chunk for a per-rank workspace of `workspace_bytes` (0: too small).
int64_t ChunkElements(Algorithm algorithm, int group_size, int64_t workspace_bytes, int element_bytes);

}  // namespace gpuext::allreduce
