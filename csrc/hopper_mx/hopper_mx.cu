// Host side of the hopper_mx kernel: tensor maps, instantiation table, launch. Compiled only
// for sm_90a (CMake puts this file in its own object library with CUDA_ARCHITECTURES 90a-real);
// the kernel body is additionally guarded by __CUDA_ARCH_FEAT_SM90_ALL in hopper_mx_kernel.cuh.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <mutex>
#include <string>
#include <vector>

#include "csrc/common/cuda_check.h"
#include "csrc/hopper_mx/hopper_mx.h"
#include "csrc/hopper_mx/hopper_mx_kernel.cuh"
#include "csrc/hopper_mx/tensor_map.h"

namespace gpuext::hopper_mx {
namespace {

// Once per (instantiation, device): above 48 KB a kernel must opt in to dynamic shared memory.
// The attribute belongs to the function on the current device and persists, so repeating it on
// every call only cost host time. Setting it also resolves, hence loads, the kernel (CUDA loads
// modules lazily by default). The statics are per instantiation (one per template argument
// list); a mutex rather than std::call_once because the device is known only at run time and a
// failure must not be remembered (the next call retries).
template <int kConsumers, int kBlockN, int kStages, Fp8 kA, Fp8 kB>
Status SetUpOnce() {
  static std::mutex mu;
  static std::vector<bool> done;  // indexed by device ordinal
  int device = 0;
  GPUEXT_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  if (device < static_cast<int>(done.size()) && done[device]) return Status::Ok();
  GPUEXT_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(HopperMxKernel<kConsumers, kBlockN, kStages, kA, kB>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   SmemLayout<kConsumers, kBlockN, kStages>::kBytes));
  if (device >= static_cast<int>(done.size())) done.resize(device + 1, false);
  done[device] = true;
  return Status::Ok();
}

// Launch reads the runtime's last error right after the launch to catch launch-configuration
// errors. A non-sticky error that other code in this process left pending (and never read) would
// then be reported as this launch's failure; it is not ours to report or to fail on, so it is
// discarded first. A sticky error (a faulted context) cannot be cleared: it surfaces at the
// post-launch check, whose message says "at or before the launch".
void DiscardStaleError() { cudaGetLastError(); }

template <int kConsumers, int kBlockN, int kStages, Fp8 kA, Fp8 kB>
Status LaunchConfig(const Problem& p, cudaStream_t stream) {
  using L = SmemLayout<kConsumers, kBlockN, kStages>;
  constexpr int kBlockM = L::kBlockM;
  const int64_t k_blocks = p.k / kScaleBlock;
  CUtensorMap map_a, map_b, map_sa, map_sb;
  GPUEXT_RETURN_IF_ERROR(Encode3d(&map_a, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, p.a, p.k, p.m, p.batch,
                                  kBlockK, kBlockM, CU_TENSOR_MAP_SWIZZLE_128B));
  GPUEXT_RETURN_IF_ERROR(Encode3d(&map_b, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, p.b, p.k, p.n, p.batch,
                                  kBlockK, kBlockN, CU_TENSOR_MAP_SWIZZLE_128B));
  GPUEXT_RETURN_IF_ERROR(Encode3d(&map_sa, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, p.a_scale,
                                  PaddedScaleDim(p.m), k_blocks, p.batch, kBlockM, kScalesPerTile,
                                  CU_TENSOR_MAP_SWIZZLE_NONE));
  GPUEXT_RETURN_IF_ERROR(Encode3d(&map_sb, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, p.b_scale,
                                  PaddedScaleDim(p.n), k_blocks, p.batch, kBlockN, kScalesPerTile,
                                  CU_TENSOR_MAP_SWIZZLE_NONE));

  GPUEXT_RETURN_IF_ERROR((SetUpOnce<kConsumers, kBlockN, kStages, kA, kB>()));

  KernelArgs args;
  args.out = p.out;
  args.m = static_cast<int>(p.m);
  args.n = static_cast<int>(p.n);
  args.k_blocks = static_cast<int>(k_blocks);
  args.out_type = static_cast<int>(p.out_type);
  args.out_batch_stride = p.m * p.n;
  // What the epilogue's rescan reads (elements whose float32 sum is not finite; promote.h).
  RescanArgs rescan;
  rescan.a = static_cast<const uint8_t*>(p.a);
  rescan.b = static_cast<const uint8_t*>(p.b);
  rescan.sa = p.a_scale;
  rescan.sb = p.b_scale;
  rescan.k = p.k;
  rescan.m_pad = PaddedScaleDim(p.m);
  rescan.n_pad = PaddedScaleDim(p.n);
  const int64_t tiles = ((p.m + kBlockM - 1) / kBlockM) * ((p.n + kBlockN - 1) / kBlockN);
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(p.batch));  // Validate: fits
  DiscardStaleError();
  HopperMxKernel<kConsumers, kBlockN, kStages, kA, kB>
      <<<grid, 128 * (kConsumers + 1), L::kBytes, stream>>>(map_a, map_b, map_sa, map_sb, args, rescan);
  GPUEXT_CUDA_RETURN_IF_LAUNCH_ERROR("HopperMxKernel");
  return Status::Ok();
}

// The one table of tile configs: calls fn(Tile<consumers, BN, stages>{}) for `config`. Stage
// counts fill most of the 227 KB: (16+16+2+2) KB x 5, (8+16+1+2) KB x 7, (16+8+2+1) KB x 6.
template <int kConsumers_, int kBlockN_, int kStages_>
struct Tile {
  static constexpr int kConsumers = kConsumers_, kBlockN = kBlockN_, kStages = kStages_;
};

template <typename Fn>
Status WithTile(TileConfig config, Fn fn) {
  switch (config) {
    case TileConfig::kM128N128: return fn(Tile<2, 128, 5>{});
    case TileConfig::kM64N128: return fn(Tile<1, 128, 7>{});
    case TileConfig::kM128N64: return fn(Tile<2, 64, 6>{});
  }
  return Status::Error("unknown tile config " + std::to_string(static_cast<int>(config)));
}

template <Fp8 kA, Fp8 kB>
Status LaunchTyped(const Problem& p, TileConfig config, cudaStream_t stream) {
  return WithTile(config, [&](auto t) {
    using T = decltype(t);
    return LaunchConfig<T::kConsumers, T::kBlockN, T::kStages, kA, kB>(p, stream);
  });
}

template <Fp8 kA, Fp8 kB>
Status SetUpTyped(TileConfig config) {
  return WithTile(config, [](auto t) {
    using T = decltype(t);
    return SetUpOnce<T::kConsumers, T::kBlockN, T::kStages, kA, kB>();
  });
}

}  // namespace

bool Available() { return true; }

Status Prepare(TileConfig config) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;  // only looked up (once) here
  GPUEXT_RETURN_IF_ERROR(TensorMapEncoder(&encode));
  GPUEXT_RETURN_IF_ERROR((SetUpTyped<Fp8::kE4M3, Fp8::kE4M3>(config)));
  GPUEXT_RETURN_IF_ERROR((SetUpTyped<Fp8::kE4M3, Fp8::kE5M2>(config)));
  GPUEXT_RETURN_IF_ERROR((SetUpTyped<Fp8::kE5M2, Fp8::kE4M3>(config)));
  GPUEXT_RETURN_IF_ERROR((SetUpTyped<Fp8::kE5M2, Fp8::kE5M2>(config)));
  return Status::Ok();
}

Status Launch(const Problem& p, TileConfig config, cudaStream_t stream) {
  GPUEXT_RETURN_IF_ERROR(Validate(p));
  if (p.batch == 0 || p.m == 0 || p.n == 0) return Status::Ok();
  const bool a4 = p.a_type == ElemType::kE4M3, b4 = p.b_type == ElemType::kE4M3;
  if (a4 && b4) return LaunchTyped<Fp8::kE4M3, Fp8::kE4M3>(p, config, stream);
  if (a4) return LaunchTyped<Fp8::kE4M3, Fp8::kE5M2>(p, config, stream);
  if (b4) return LaunchTyped<Fp8::kE5M2, Fp8::kE4M3>(p, config, stream);
  return LaunchTyped<Fp8::kE5M2, Fp8::kE5M2>(p, config, stream);
}

}  // namespace gpuext::hopper_mx
