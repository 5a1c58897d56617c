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
  // tile table, its count, the group starts, the groups' first tiles (hopper_grouped.cu CarveTiles)
  return Section(static_cast<size_t>(TileCapacity(m, groups, kTileRows)) * sizeof(GroupTile)) + Section(4) +
         Section(static_cast<size_t>(groups + 1) * sizeof(int64_t)) +
         Section(static_cast<size_t>(groups + 1) * sizeof(int32_t));
}

Status Validate(const Problem& p) {
  const std::string dims = "m=" + std::to_string(p.m) + " n=" + std::to_string(p.n) + " k=" + std::to_string(p.k) +
                           " groups=" + std::to_string(p.groups) + " capacity=" + std::to_string(p.capacity);
  if (p.m < 0 || p.n < 0 || p.groups < 0 || p.k <= 0 || p.k % 16 != 0)
    return Status::Error("need m, n, groups >= 0 and k a positive multiple of 16 (TMA row strides): " + dims);
  if (p.n % 8 != 0) return Status::Error("n must be a multiple of 8 (16-byte output rows): " + dims);
  if (p.capacity >= 0 && p.m != p.groups * p.capacity)
    return Status::Error("the masked layout needs m = groups * capacity: " + dims);
  // TMA coordinates and our row indices are int32: rows of lhs (plus a tile), rows of rhs viewed
  // as (G*N, K), the items of the persistent loop (with a grid's worth of slack).
  constexpr int64_t kLimit = int64_t(1) << 31;
  if (p.m + kTileRows >= kLimit || p.k >= kLimit || p.groups * p.n >= kLimit)
    return Status::Error("m + 128, k and groups * n must be < 2^31: " + dims);
  if (p.m == 0 || p.n == 0) return Status::Ok();
  const int64_t items = TileCapacity(p.m, p.groups, kTileRows) * ((p.n + kBlockN - 1) / kBlockN);
  if (items >= kLimit / 2) return Status::Error("too many output tiles (< 2^30 needed): " + dims);
  for (const void* ptr : std::initializer_list<const void*>{p.lhs, p.rhs, p.lhs_scale, p.out, p.workspace}) {
    if (ptr == nullptr || reinterpret_cast<uintptr_t>(ptr) % 16 != 0)
      return Status::Error("operands, out and workspace must be non-null and 16-byte aligned (TMA, 16-byte stores)");
  }
  if (p.rhs_scale == nullptr || p.group_sizes == nullptr) return Status::Error("null rhs scales or group sizes");
  return Status::Ok();
}

Status ValidateWgrad(const WgradProblem& p) {
  const std::string dims = "m=" + std::to_string(p.m) + " k=" + std::to_string(p.k) + " n=" + std::to_string(p.n) +
                           " groups=" + std::to_string(p.groups) + " blocks=" + std::to_string(p.blocks);
  if (p.m < 0 || p.k < 0 || p.n < 0 || p.groups < 0 || p.blocks < 0)
    return Status::Error("need m, k, n, groups, blocks >= 0: " + dims);
  if (p.n % 8 != 0) return Status::Error("n must be a multiple of 8 (16-byte output rows): " + dims);
  // Every group's blocks must lie in the slot layout: the most any sizes can need.
  const int64_t most = p.m == 0 ? 0 : (p.m + (p.groups + 1) * (kBlockK - 1)) / kBlockK;
  if (p.blocks < (most < p.m ? most : p.m))
    return Status::Error("blocks must be grouped_block_count(m, groups, 128): " + dims);
  constexpr int64_t kLimit = int64_t(1) << 31;
  if (p.m + kTileRows >= kLimit || p.k + kTileRows >= kLimit || p.n + kBlockN >= kLimit ||
      p.blocks * kBlockK >= kLimit)
    return Status::Error("m, k, n and 128 * blocks must be < 2^31 - 128: " + dims);
  if (WgradItems(p.groups, p.k, p.n) >= kLimit / 2) return Status::Error("too many output tiles (< 2^30): " + dims);
  const void* need[] = {p.out, p.workspace, p.group_sizes};
  for (const void* ptr : need) {
    if (ptr == nullptr || reinterpret_cast<uintptr_t>(ptr) % 16 != 0)
      return Status::Error("out, workspace and group sizes must be non-null and 16-byte aligned");
  }
  if (p.blocks > 0 && p.k > 0 && p.n > 0) {
    for (const void* ptr : std::initializer_list<const void*>{p.a, p.b, p.a_scale, p.b_scale}) {
      if (ptr == nullptr || reinterpret_cast<uintptr_t>(ptr) % 16 != 0)
        return Status::Error("operands and their scales must be non-null and 16-byte aligned (TMA)");
    }
  }
  return Status::Ok();
}

#ifndef GPUEXT_HAVE_HOPPER_MX
bool Available() { return false; }

constexpr char kNoKernel[] =
    "jax_gpuext was built without sm_90a in JAX_GPUEXT_CUDA_ARCHITECTURES, so the grouped Hopper kernel is "
    "absent; rebuild with 90a-real in the list";

Status Launch(const Problem&, cudaStream_t) { return Status::Error(kNoKernel); }

Status LaunchWgrad(const WgradProblem&, cudaStream_t) { return Status::Error(kNoKernel); }

Status Prepare() { return Status::Error(kNoKernel); }
#endif

}  // namespace gpuext::hopper_grouped
