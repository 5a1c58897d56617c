// CUDA events recorded on a stream into a process-wide table of slots, for timing work on the
// device from the host without synchronizing between calls (benchmarks/_devtime.py; docs/design.md,
// "Benchmarks that measure the hardware", "Timing round 2").
//
// A slot is a list: each record appends one event, so a program run k times records k events in
// each of its slots (its slot numbers are compile-time attributes), and entry i of one slot pairs
// with entry i of another. Reading waits for the events it reads; nothing here synchronizes a
// stream or the device.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "csrc/common/status.h"

namespace gpuext {

inline constexpr int64_t kTimerSlots = 16;
// Entries a slot holds before it must be reset: a bound on the events the table creates (an
// event is a few hundred bytes of driver state), far above what one timed batch records.
inline constexpr int64_t kTimerMaxEntries = 4096;

// Records an event on `stream` (of CUDA device `device`) as the next entry of `slot`.
Status TimerRecord(int64_t slot, int device, cudaStream_t stream);

// Forgets the entries of `slot` (every slot for -1); the events are kept for reuse.
Status TimerReset(int64_t slot);

// Entries recorded in `slot` since its last reset.
Status TimerCount(int64_t slot, int64_t* count);

// Milliseconds from entry i of `start_slot` to entry i + shift of `end_slot`, for every i at which
// both exist, in order of i; waits for each pair to complete. shift = 1 with the slots swapped
// gives the gaps between consecutive calls.
Status TimerElapsedMs(int64_t start_slot, int64_t end_slot, int64_t shift, std::vector<float>* out);

}  // namespace gpuext
