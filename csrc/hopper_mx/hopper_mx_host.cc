// Problem validation (always built), and the stand-ins of Launch and Prepare for builds without
// sm_90a.
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
  // every dimension < 2^32; grid.x < 2^31 and grid.y (batch) <= 65535; int32 row/col indices.
  if (p.m >= (int64_t(1) << 31) || p.n >= (int64_t(1) << 31) || p.k >= (int64_t(1) << 31))
    return Status::Error("m, n, k must be < 2^31: " + dims());
  if (p.batch > 65535) return Status::Error("batch must be <= 65535: " + dims());
  if (p.batch == 0 || p.m == 0 || p.n == 0) return Status::Ok();
  // m * n < 2^62 by the check above; comparing against 2^62 / batch keeps the product from
  // overflowing int64 (undefined behaviour) in the check itself.
  if (p.m * p.n >= (int64_t(1) << 62) / p.batch) return Status::Error("output too large: " + dims());
  // grid.x is the tile count. Every tile config is at least 64 x 64, so this bounds all of them.
  const int64_t max_tiles = ((p.m + 63) / 64) * ((p.n + 63) / 64);
  if (max_tiles >= (int64_t(1) << 31))
    return Status::Error("too many output tiles for grid.x (< 2^31 needed): " + dims());
  for (const void* ptr : {p.a, p.b, static_cast<const void*>(p.a_scale), static_cast<const void*>(p.b_scale)}) {
    if (ptr == nullptr || reinterpret_cast<uintptr_t>(ptr) % 16 != 0)
      return Status::Error("operands must be non-null and 16-byte aligned (TMA)");
  }
  // The epilogue stores pairs of adjacent outputs (float2, __nv_bfloat162, __half2) at even
  // element offsets, so `out` must be aligned to two elements.
  const uintptr_t pair_bytes = p.out_type == OutType::kF32 ? 8 : 4;
  if (p.out == nullptr || reinterpret_cast<uintptr_t>(p.out) % pair_bytes != 0)
    return Status::Error("out must be non-null and " + std::to_string(pair_bytes) +
                         "-byte aligned (paired stores)");
  return Status::Ok();
}

#ifndef GPUEXT_HAVE_HOPPER_MX
bool Available() { return false; }

constexpr char kNoKernel[] =
    "jax_gpuext was built without sm_90a in JAX_GPUEXT_CUDA_ARCHITECTURES, so the hopper_mx "
    "kernel is absent; rebuild with 90a-real in the list";

Status Launch(const Problem&, TileConfig, cudaStream_t) { return Status::Error(kNoKernel); }

Status Prepare(TileConfig) { return Status::Error(kNoKernel); }
#endif

}  // namespace gpuext::hopper_mx
