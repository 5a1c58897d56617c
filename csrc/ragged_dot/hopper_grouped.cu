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

// Once per device: the dynamic shared memory opt-in (above 48 KB), which also loads the kernel,
// and the SM count the persistent grid is sized by. A failure is not remembered: the next call
// retries.
Status SetUpOnce(int* sms) {
  static std::mutex mu;
  static std::vector<int> sm_count;  // by device ordinal; 0: not set up yet
  int device = 0;
  GPUEXT_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  if (device < static_cast<int>(sm_count.size()) && sm_count[device] > 0) {
    *sms = sm_count[device];
    return Status::Ok();
  }
  GPUEXT_CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(GroupedFp8Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Smem::kBytes));
  GPUEXT_CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(GroupedWgradKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, WgradSmem::kBytes));
  int count = 0;
  GPUEXT_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  if (count <= 0) return Status::Error("the device reports no multiprocessors");
  if (device >= static_cast<int>(sm_count.size())) sm_count.resize(device + 1, 0);
  sm_count[device] = count;
  *sms = count;
  return Status::Ok();
}

GroupTiles CarveTiles(void* workspace, int64_t m, int64_t groups);
GroupTiles CarveTiles(const Problem& p) { return CarveTiles(p.workspace, p.m, p.groups); }

GroupTiles CarveTiles(void* workspace, int64_t m, int64_t groups) {
  char* base = static_cast<char*>(workspace);
  auto section = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
  GroupTiles t;
  t.tiles = reinterpret_cast<GroupTile*>(base);
  base += section(TileCapacity(m, groups, kTileRows) * sizeof(GroupTile));
  t.count = reinterpret_cast<int32_t*>(base);
  base += section(4);
  t.row_start = reinterpret_cast<int64_t*>(base);
  base += section((groups + 1) * sizeof(int64_t));
  t.tile_start = reinterpret_cast<int32_t*>(base);
  return t;
}

Status Encode(CUtensorMap* map, CUtensorMapDataType type, const void* ptr, const MapShape& s) {
  return hopper_mx::Encode3d(map, type, s.elem_bytes, ptr, s.d0, s.d1, s.d2, s.box0, s.box1,
                             s.swizzle_128b ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE);
}

}  // namespace

bool Available() { return true; }

Status Prepare() {
  PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;  // only looked up (once) here
  GPUEXT_RETURN_IF_ERROR(hopper_mx::TensorMapEncoder(&encode));
  int sms = 0;
  return SetUpOnce(&sms);
}

Status Launch(const Problem& p, cudaStream_t stream) {
  GPUEXT_RETURN_IF_ERROR(Validate(p));
  if (p.m == 0 || p.n == 0) return Status::Ok();
  const GroupTiles tiles = CarveTiles(p);
  GPUEXT_RETURN_IF_ERROR(LaunchGroupedTiles(p.group_sizes, p.groups, p.m, kTileRows, p.capacity, tiles, stream));
  if (p.groups > 0) {
    // The shapes the CPU schedule test checks against TMA's rules (hopper_grouped_schedule.h).
    const MapShapes shapes = TensorMapShapes(p.m, p.n, p.k, p.groups);
    CUtensorMap map_a, map_b, map_sa;
    GPUEXT_RETURN_IF_ERROR(Encode(&map_a, CU_TENSOR_MAP_DATA_TYPE_UINT8, p.lhs, shapes.a));
    GPUEXT_RETURN_IF_ERROR(Encode(&map_b, CU_TENSOR_MAP_DATA_TYPE_UINT8, p.rhs, shapes.b));
    GPUEXT_RETURN_IF_ERROR(Encode(&map_sa, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, p.lhs_scale, shapes.sa));
    int sms = 0;
    GPUEXT_RETURN_IF_ERROR(SetUpOnce(&sms));
    Args args;
    args.out = p.out;
    args.n = static_cast<int>(p.n);
    args.k_tiles = static_cast<int>(KTiles(p.k));
    args.n_blocks = static_cast<int>((p.n + kBlockN - 1) / kBlockN);
    args.out_type = static_cast<int>(p.out_type);
    args.tiles = tiles.tiles;
    args.tile_count = tiles.count;
    args.rhs_scale = p.rhs_scale;
    const int64_t grid = PersistentGrid(TileCapacity(p.m, p.groups, kTileRows), p.n, sms);
    cudaGetLastError();  // a pending error from unrelated earlier work is not this launch's
    GroupedFp8Kernel<<<static_cast<unsigned>(grid), kThreads, Smem::kBytes, stream>>>(map_a, map_b, map_sa, args);
    GPUEXT_CUDA_RETURN_IF_LAUNCH_ERROR("GroupedFp8Kernel");
  }
  const int64_t row_bytes = p.n * (p.out_type == hopper_mx::OutType::kF32 ? 4 : 2);
  if (p.capacity >= 0) return LaunchZeroMaskedRows(p.out, p.groups, p.capacity, row_bytes, p.group_sizes, stream);
  return LaunchFinishRows(p.out, p.m, row_bytes, tiles.row_start, nullptr, p.groups, nullptr, stream);
}

Status LaunchWgrad(const WgradProblem& p, cudaStream_t stream) {
  GPUEXT_RETURN_IF_ERROR(ValidateWgrad(p));
  const int64_t elem = p.out_type == hopper_mx::OutType::kF32 ? 4 : 2;
  if (p.groups == 0 || p.k == 0 || p.n == 0) return Status::Ok();
  cudaGetLastError();  // a pending error from unrelated earlier work is not this launch's
  if (p.m == 0 || p.blocks == 0) {  // no tokens: every group's gradient is zero
    GPUEXT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(p.out, 0, static_cast<size_t>(p.groups * p.k * p.n * elem), stream));
    return Status::Ok();
  }
  const GroupTiles tiles = CarveTiles(p.workspace, p.m, p.groups);
  GPUEXT_RETURN_IF_ERROR(LaunchGroupedTiles(p.group_sizes, p.groups, p.m, kTileRows, -1, tiles, stream));
  // The shapes the CPU schedule test checks against TMA's rules (hopper_grouped_schedule.h).
  const WgradMapShapes shapes = WgradTensorMapShapes(p.k, p.n, p.blocks);
  CUtensorMap map_a, map_b, map_sa, map_sb;
  GPUEXT_RETURN_IF_ERROR(Encode(&map_a, CU_TENSOR_MAP_DATA_TYPE_UINT8, p.a, shapes.a));
  GPUEXT_RETURN_IF_ERROR(Encode(&map_b, CU_TENSOR_MAP_DATA_TYPE_UINT8, p.b, shapes.b));
  GPUEXT_RETURN_IF_ERROR(Encode(&map_sa, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, p.a_scale, shapes.sa));
  GPUEXT_RETURN_IF_ERROR(Encode(&map_sb, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, p.b_scale, shapes.sb));
  int sms = 0;
  GPUEXT_RETURN_IF_ERROR(SetUpOnce(&sms));
  WgradArgs args;
  args.out = p.out;
  args.k = static_cast<int>(p.k);
  args.n = static_cast<int>(p.n);
  args.groups = static_cast<int>(p.groups);
  args.out_type = static_cast<int>(p.out_type);
  args.tile_start = tiles.tile_start;
  const int64_t grid = WgradGrid(p.groups, p.k, p.n, sms);
  GroupedWgradKernel<<<static_cast<unsigned>(grid), kThreads, WgradSmem::kBytes, stream>>>(map_a, map_b, map_sa,
                                                                                           map_sb, args);
  GPUEXT_CUDA_RETURN_IF_LAUNCH_ERROR("GroupedWgradKernel");
  return Status::Ok();
}

}  // namespace gpuext::hopper_grouped
