// Validation and the workspace size of the grouped sm_90a kernel (always built), and the
// stand-ins of Launch and Prepare for builds without sm_90a.
#include <initializer_list>
#include <string>

#include "csrc/ragged_dot/grouped_layout.h"
#include "csrc/ragged_dot/hopper_grouped.h"

namespace gpuext::hopper_grouped {

namespace {
size_t Section(size_t bytes) { return (bytes + 255) / 256 * 256; }
}  // namespace

size_t WorkspaceBytes(int64_t m, int64_t groups) {
  // tile table, its count, the group starts (hopper_grouped.cu CarveTiles)
  return Section(static_cast<size_t>(TileCapacity(m, groups, kTileRows)) * sizeof(GroupTile)) + Section(4) +
         Section(static_cast<size_t>(groups + 1) * sizeof(int64_t));
}

Status Validate(const Problem& p) {
  const std::string dims = "m=" + std::to_string(p.m) + " n=" + std::to_string(p.n) + " k=" + std::to_string(p.k) +
                           " groups=" + std::to_string(p.groups);
  if (p.m < 0 || p.n < 0 || p.groups < 0 || p.k <= 0 || p.k % 128 != 0)
    return Status::Error("need m, n, groups >= 0 and k a positive multiple of 128: " + dims);
  if (p.n % 8 != 0) return Status::Error("n must be a multiple of 8 (16-byte output rows): " + dims);
  // TMA coordinates and our row indices are int32: rows of lhs, rows of rhs viewed as (G*N, K).
  constexpr int64_t kLimit = int64_t(1) << 31;
  if (p.m + 3 >= kLimit || p.k >= kLimit || p.groups * p.n >= kLimit)
    return Status::Error("m, k and groups * n must be < 2^31: " + dims);
  if (p.m == 0 || p.n == 0) return Status::Ok();
  const int64_t grid = TileCapacity(p.m, p.groups, kTileRows) * ((p.n + 127) / 128);
  if (grid >= kLimit) return Status::Error("too many tiles for grid.x (< 2^31 needed): " + dims);
  for (const void* ptr : std::initializer_list<const void*>{p.lhs, p.rhs, p.lhs_scale, p.out, p.workspace}) {
    if (ptr == nullptr || reinterpret_cast<uintptr_t>(ptr) % 16 != 0)
      return Status::Error("operands, out and workspace must be non-null and 16-byte aligned (TMA, 16-byte stores)");
  }
  if (p.rhs_scale == nullptr || p.group_sizes == nullptr) return Status::Error("null rhs scales or group sizes");
  return Status::Ok();
}

#ifndef GPUEXT_HAVE_HOPPER_MX
bool Available() { return false; }

constexpr char kNoKernel[] =
    "jax_gpuext was built without sm_90a in JAX_GPUEXT_CUDA_ARCHITECTURES, so the grouped Hopper kernel is "
    "absent; rebuild with 90a-real in the list";

Status Launch(const Problem&, cudaStream_t) { return Status::Error(kNoKernel); }

Status Prepare() { return Status::Error(kNoKernel); }
#endif

}  // namespace gpuext::hopper_grouped
