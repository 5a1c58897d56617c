// A kernel that keeps a stream busy for a given time (benchmarks/_devtime.py): launched before a
// batch of timed calls, it lets the host enqueue the whole batch while the GPU waits, so that no
// call's kernels wait for the host's launches (docs/design.md, "Timing round 2").
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "csrc/common/status.h"

namespace gpuext {

// The longest hold the kernel honours (a larger request is clamped): one second.
inline constexpr int32_t kTimerMaxHoldUs = 1000000;

// Enqueues one single-thread kernel on `stream` that reads *hold_us (device memory) and returns
// after that many microseconds (clamped to [0, kTimerMaxHoldUs]) of the GPU's global timer.
Status LaunchTimerHold(const int32_t* hold_us, cudaStream_t stream);

}  // namespace gpuext
