// Problem validation (always built), and the stand-in Launch for builds without sm_90a.
#include <string>

#include "csrc/hopper_mx/hopper_mx.h"

namespace gpuext::hopper_mx {

Status Validate(const Problem& p) {
  auto dims = [&] {
    return "batch=" + std::to_string(p.batch) + " m=" + std::to_string(p.m) + " n=" +
           std::to_string(p.n) + " k=" + std::to_string(p.k);
  };
  if (p.batch < 0 || p.m < 0 || p.n < 0 || p.k <= 0) return Status::Error("bad sizes: " + dims());
  if (p.k % kScaleBlock != 0)
    return Status::Error("k must be a multiple of " + std::to_string(kScaleBlock) + ": " + dims());
  // TMA: global strides multiple of 16 bytes (k % 32 covers A/B; m_pad % 4 the fp32 scales),
  // every dimension < 2^32, grid.x < 2^31 and grid.y (batch) <= 65535, int32 row/col indices.
  if (p.m >= (int64_t(1) << 31) || p.n >= (int64_t(1) << 31) || p.k >= (int64_t(1) << 31))
    return Status::Error("m, n, k must be < 2^31: " + dims());
  if (p.batch > 65535) return Status::Error("batch must be <= 65535: " + dims());
  if (p.batch * p.m * p.n >= (int64_t(1) << 62)) return Status::Error("output too large: " + dims());
  if (p.batch == 0 || p.m == 0 || p.n == 0) return Status::Ok();
  for (const void* ptr : {p.a, p.b, static_cast<const void*>(p.a_scale), static_cast<const void*>(p.b_scale)}) {
    if (ptr == nullptr || reinterpret_cast<uintptr_t>(ptr) % 16 != 0)
      return Status::Error("operands must be non-null and 16-byte aligned (TMA)");
  }
  if (p.out == nullptr) return Status::Error("null output");
  return Status::Ok();
}

#ifndef GPUEXT_HAVE_HOPPER_MX
bool Available() { return false; }

Status Launch(const Problem&, TileConfig, cudaStream_t) {
  return Status::Error(
      "jax_gpuext was built without sm_90a in JAX_GPUEXT_CUDA_ARCHITECTURES, so the hopper_mx "
      "kernel is absent; rebuild with 90a-real in the list");
}
#endif

}  // namespace gpuext::hopper_mx
