#include "csrc/timer/hold.h"

#include "csrc/common/cuda_check.h"

namespace gpuext {
namespace {

// %globaltimer: nanoseconds, the same clock on every SM and independent of the SM clock (which
// clock64() counts, and which changes with the GPU's boost state).
__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void TimerHoldKernel(const int32_t* hold_us) {
  const uint64_t start = GlobalTimerNs();
  int32_t us = *hold_us;
  us = us < 0 ? 0 : (us > kTimerMaxHoldUs ? kTimerMaxHoldUs : us);
  const uint64_t end = start + static_cast<uint64_t>(us) * 1000u;
  // Sleeping between reads leaves the SM's issue slots to whatever else runs (sm_70+).
  while (GlobalTimerNs() < end) __nanosleep(1000);
}

}  // namespace

Status LaunchTimerHold(const int32_t* hold_us, cudaStream_t stream) {
  TimerHoldKernel<<<1, 1, 0, stream>>>(hold_us);
  GPUEXT_CUDA_RETURN_IF_LAUNCH_ERROR("TimerHoldKernel");
  return Status::Ok();
}

}  // namespace gpuext
