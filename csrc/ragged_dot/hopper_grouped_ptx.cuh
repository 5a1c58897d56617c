// The sm_90a instructions the grouped kernels use beyond hopper_mx's wrappers (csrc/hopper_mx/ptx.cuh,
// which they share): per-warpgroup register reallocation. Device code only; include from .cu files.
#pragma once

#include <cstdint>

namespace gpuext::hopper_grouped {

// setmaxnreg (PTX ISA, miscellaneous instructions; sm_90a): the warpgroup's threads give up
// registers (dec) or wait until the CTA's pool has them (inc). Every thread of the warpgroup must
// execute it (.sync.aligned), and the counts must be multiples of 8 in [24, 256]. The producer
// warpgroup issues TMA only and keeps 40; the two consumer warpgroups take the rest:
// 128 x 40 + 256 x 232 = 64,512 of 65,536.
template <int kRegs>
__device__ __forceinline__ void WarpgroupRegDealloc() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg: a multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void WarpgroupRegAlloc() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg: a multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}

// Waits for the phase of parity `parity` of an mbarrier (PTX ISA, mbarrier.try_wait), the loop
// written in PTX. The consumers wait for a stage while the previous K tile's wgmma is in flight;
// hopper_mx's MbarWait loops in C++ on the per-thread result, a branch ptxas treats as divergent,
// and a divergent branch between a wgmma and its wait_group makes ptxas serialise every wgmma
// of the kernel (warning C7518, "program dependence on compiler-inserted WG.DP in divergent
// path"). With the loop inside one asm statement it does not.
__device__ __forceinline__ void MbarWaitUniform(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))),
      "r"(parity)
      : "memory");
}

// One arrival on an mbarrier by the threads whose `pred` is true, without a branch (same reason).
__device__ __forceinline__ void MbarArriveIf(uint64_t* bar, bool pred) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %1, 0;\n"
      "@p mbarrier.arrive.shared::cta.b64 _, [%0];\n}\n" ::"r"(
          static_cast<uint32_t>(__cvta_generic_to_shared(bar))),
      "r"(static_cast<int>(pred))
      : "memory");
}

}  // namespace gpuext::hopper_grouped
