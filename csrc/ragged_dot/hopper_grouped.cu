// Host side of the grouped sm_90a kernel: workspace, tensor maps, launch. Compiled only for
// sm_90a (cmake/hopper_mx.cmake's object library); hopper_grouped_host.cc has the rest.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <mutex>
#include <vector>

#include "csrc/common/cuda_check.h"
#include "csrc/hopper_mx/tensor_map.h"
#include "csrc/ragged_dot/hopper_grouped.h"
#include "csrc/ragged_dot/hopper_grouped_kernel.cuh"

namespace gpuext::hopper_grouped {
namespace {

// Once per device: the dynamic shared memory opt-in (above 48 KB), which also loads the kernel.
// A failure is not remembered: the next call retries.
Status SetUpOnce() {
  static std::mutex mu;
  static std::vector<bool> done;  // by device ordinal
  int device = 0;
  GPUEXT_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  if (device < static_cast<int>(done.size()) && done[device]) return Status::Ok();
  GPUEXT_CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(GroupedFp8Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Smem::kBytes));
  if (device >= static_cast<int>(done.size())) done.resize(device + 1, false);
  done[device] = true;
  return Status::Ok();
}

GroupTiles CarveTiles(const Problem& p) {
  char* base = static_cast<char*>(p.workspace);
  GroupTiles t;
  t.tiles = reinterpret_cast<GroupTile*>(base);
  base += (TileCapacity(p.m, p.groups, kTileRows) * sizeof(GroupTile) + 255) / 256 * 256;
  t.count = reinterpret_cast<int32_t*>(base);
  t.row_start = reinterpret_cast<int64_t*>(base + 256);
  return t;
}

}  // namespace

bool Available() { return true; }

Status Prepare() {
  PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;  // only looked up (once) here
  GPUEXT_RETURN_IF_ERROR(hopper_mx::TensorMapEncoder(&encode));
  return SetUpOnce();
}

Status Launch(const Problem& p, cudaStream_t stream) {
  GPUEXT_RETURN_IF_ERROR(Validate(p));
  if (p.m == 0 || p.n == 0) return Status::Ok();
  const GroupTiles tiles = CarveTiles(p);
  GPUEXT_RETURN_IF_ERROR(LaunchGroupedTiles(p.group_sizes, p.groups, p.m, kTileRows, tiles, stream));
  if (p.groups > 0) {
    const int64_t m4 = (p.m + 3) / 4 * 4;
    CUtensorMap map_a, map_b, map_sa;
    GPUEXT_RETURN_IF_ERROR(hopper_mx::Encode3d(&map_a, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, p.lhs, p.k, p.m, 1, kBlockK,
                                               kTileRows, CU_TENSOR_MAP_SWIZZLE_128B));
    GPUEXT_RETURN_IF_ERROR(hopper_mx::Encode3d(&map_b, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, p.rhs, p.k, p.groups * p.n, 1,
                                               kBlockK, kBlockN, CU_TENSOR_MAP_SWIZZLE_128B));
    GPUEXT_RETURN_IF_ERROR(hopper_mx::Encode3d(&map_sa, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, p.lhs_scale, m4,
                                               p.k / kBlockK, 1, kTileRows, 1, CU_TENSOR_MAP_SWIZZLE_NONE));
    GPUEXT_RETURN_IF_ERROR(SetUpOnce());
    Args args;
    args.out = p.out;
    args.n = static_cast<int>(p.n);
    args.k_tiles = static_cast<int>(p.k / kBlockK);
    args.n_blocks = static_cast<int>((p.n + kBlockN - 1) / kBlockN);
    args.out_type = static_cast<int>(p.out_type);
    args.tiles_max = static_cast<int>(TileCapacity(p.m, p.groups, kTileRows));
    args.tiles = tiles.tiles;
    args.tile_count = tiles.count;
    args.rhs_scale = p.rhs_scale;
    const int64_t grid = static_cast<int64_t>(args.tiles_max) * args.n_blocks;  // Validate: < 2^31
    cudaGetLastError();  // a pending error from unrelated earlier work is not this launch's
    GroupedFp8Kernel<<<static_cast<unsigned>(grid), 128 * (kConsumers + 1), Smem::kBytes, stream>>>(map_a, map_b,
                                                                                                  map_sa, args);
    GPUEXT_CUDA_RETURN_IF_LAUNCH_ERROR("GroupedFp8Kernel");
  }
  const int64_t row_bytes = p.n * (p.out_type == hopper_mx::OutType::kF32 ? 4 : 2);
  return LaunchFinishRows(p.out, p.m, row_bytes, tiles.row_start, nullptr, p.groups, nullptr, stream);
}

}  // namespace gpuext::hopper_grouped
