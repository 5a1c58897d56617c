// Thin inline-PTX wrappers for the sm_90 features the hopper_mx kernel uses: mbarriers, TMA
// tensor loads and the wgmma fences / shared-memory matrix descriptor. Each names the PTX ISA
// section (ISA 8.x numbering) it implements. Device code only; include from .cu files.
#pragma once

#include <cuda.h>  // CUtensorMap (a 128-byte opaque struct; no driver library is linked)

#include <cstdint>

namespace gpuext::hopper_mx {

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarrier (9.7.13.15) --------------------------------------------------------------
__device__ __forceinline__ void MbarInit(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(SmemAddr(bar)), "r"(arrivals)
               : "memory");
}

// Makes the initialised barriers visible to the async proxy (the TMA unit signals them) and
// to the other threads, before any of them is used (9.7.13.15.4, fence.mbarrier_init).
__device__ __forceinline__ void FenceBarrierInit() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// One arrival plus "expect `bytes` more transaction bytes in this phase" (9.7.13.15.11).
__device__ __forceinline__ void MbarArriveExpectTx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(SmemAddr(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void MbarArrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(SmemAddr(bar)) : "memory");
}

// Blocks until the phase of parity `parity` has completed (9.7.13.15.16). A freshly
// initialised barrier is in phase 0, and waiting for parity 1 returns at once: that is how the
// producer's first pass over the (still empty) stages proceeds without a consumer release.
__device__ __forceinline__ void MbarWait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(SmemAddr(bar)), "r"(parity)
        : "memory");
  } while (!done);
}

// ---- TMA (9.7.9.25.5.1, cp.async.bulk.tensor) ------------------------------------------
// 3-D tile load global -> shared, completion counted in bytes on `bar`. Coordinates are in
// elements, innermost first; parts of the box outside the tensor are filled with zeros and
// still count toward the transaction bytes. `map` must live in param/const/global space: we
// pass the __grid_constant__ kernel parameter's address.
__device__ __forceinline__ void TmaLoad3d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0,
                                          int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(SmemAddr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(SmemAddr(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// Pulls a tensor map into the descriptor cache ahead of its first TMA (PTX ISA "prefetch,
// prefetchu": prefetch.tensormap; no state space = generic addressing, which a
// __grid_constant__ parameter's address is). Without it the first TMA of each CTA and map waits
// for the 128-byte descriptor to be fetched.
__device__ __forceinline__ void PrefetchTensorMap(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// ---- wgmma bookkeeping (9.7.15.6) ------------------------------------------------------
// fence: orders our register writes to the accumulators before the next wgmma reads them.
__device__ __forceinline__ void WgmmaFence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}
// The compiler does not know that wgmma writes the accumulators asynchronously; this empty asm
// "modifies" a register so no read of it can be hoisted above the wait that precedes it.
__device__ __forceinline__ void FenceRegister(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// ---- shared-memory matrix descriptor (9.7.15.5.1) ---------------------------------------
// For a K-major tile written by TMA with CU_TENSOR_MAP_SWIZZLE_128B: rows of 128 bytes, 8-row
// swizzle atoms of 1024 bytes stacked along M/N. Fields: start address >> 4 (bits 0-13),
// leading byte offset >> 4 (16-29; unused for swizzled K-major when the instruction's K extent,
// 32 bytes here, lies inside one 128-byte row; set to 1 by convention), stride byte offset >> 4
// (32-45; 1024 = distance between 8-row atoms), base offset (49-51; 0 because every tile starts
// on a 1024-byte boundary), swizzle mode (62-63; 1 = 128-byte). Stepping K by 32 elements inside
// the atom is done by adding 32 bytes to the start address: the hardware applies the XOR swizzle
// to the final address bits, which matches TMA's pattern as long as the atom is 1024-aligned.
__device__ __forceinline__ uint64_t DescKMajorSw128(const void* smem) {
  const uint64_t addr = SmemAddr(smem);
  uint64_t desc = (addr & 0x3FFFF) >> 4;
  desc |= uint64_t(1) << 16;
  desc |= uint64_t(1024 >> 4) << 32;
  desc |= uint64_t(1) << 62;
  return desc;
}

}  // namespace gpuext::hopper_mx
