// Block-scaled FP8 matmul on Hopper tensor cores (sm_90a): out[b] = sum_k a[b,m,k] b[b,n,k] s,
// where the scale s of every 32-long K block is applied to an fp32 partial product ("promotion")
// instead of dequantizing the operands. Serves MXFP8 directly and NVFP4 after the Python side
// has widened it (jax_gpuext/hopper_mx.py, docs/design.md "hopper_mx").
//
// Host API only: raw pointers, sizes, a stream, a Status. No XLA, no nanobind.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "csrc/common/status.h"

namespace gpuext::hopper_mx {

// Length of a scale block along K, in elements: one k32 wgmma per block.
inline constexpr int kScaleBlock = 32;

enum class ElemType : int { kE4M3 = 0, kE5M2 = 1 };
enum class OutType : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

// Tile configurations. The Python autotuner stores these ids, so never renumber them; append.
enum class TileConfig : int {
  kM128N128 = 0,  // 2 consumer warpgroups x m64n128; large M (prefill / training)
  kM64N128 = 1,   // 1 consumer warpgroup; small M (decode): half the wasted rows at M <= 64
  kM128N64 = 2,   // more CTAs when (M/128)*(N/128) would leave SMs idle
};
inline constexpr int kNumTileConfigs = 3;

struct Problem {
  int64_t batch = 1, m = 0, n = 0, k = 0;  // k % kScaleBlock == 0
  ElemType a_type = ElemType::kE4M3, b_type = ElemType::kE4M3;
  OutType out_type = OutType::kBF16;
  const void* a = nullptr;        // [batch, m, k] FP8, row-major (K contiguous)
  const void* b = nullptr;        // [batch, n, k] FP8, row-major (K contiguous)
  const float* a_scale = nullptr;  // [batch, k/32, m_pad] fp32, m_pad = RoundUp(m, 4)
  const float* b_scale = nullptr;  // [batch, k/32, n_pad] fp32
  void* out = nullptr;             // [batch, m, n] of out_type
};

inline int64_t PaddedScaleDim(int64_t rows) { return (rows + 3) / 4 * 4; }

// Checks the problem against the kernel's requirements (TMA: 16-byte aligned addresses and
// strides; aligned output pairs; limits of the grid). The size rules are also in
// jax_gpuext/hopper_mx.py's supports().
Status Validate(const Problem& p);

// Launches on `stream`. Allocates nothing and never synchronises. Returns an error when the
// extension was built without sm_90a (then Available() is false too), and refuses to launch
// when a CUDA runtime error from earlier work is pending (it would be misattributed).
Status Launch(const Problem& p, TileConfig config, cudaStream_t stream);

// The one-time work of the first Launch of `config` (any element types) on the current device:
// the kernels' shared-memory opt-in, which also loads them, and the lookup of the driver's
// tensor-map encoder. Launch does it on first use anyway; calling this earlier keeps that work
// out of a CUDA graph capture (the FFI handler calls it from XLA's initialize stage). Cheap once
// done; thread-safe.
Status Prepare(TileConfig config);

// True when the sm_90a kernel was compiled into this module.
bool Available();

}  // namespace gpuext::hopper_mx
