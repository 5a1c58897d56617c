// Our sm_90a grouped FP8 blockwise matmul for ragged_dot (docs/design.md, "Our own Hopper
// kernel"): the DeepSeek-V3 recipe, FP8_1x128 activations x FP8_128x128 expert weights, one
// kernel for all groups, group sizes read on the device only.
//
//   out[r, n] = sum_kt s_lhs[r, kt] s_rhs[g, n/128, kt] * sum_{k in tile kt} lhs[r, k] rhs[g, n, k]
//
// for the rows r of group g (clamped as csrc/ragged_dot/grouped_layout.h says); rows past the
// groups are written as zeros. Host API only: raw pointers, sizes, a stream, a Status.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "csrc/common/status.h"
#include "csrc/hopper_mx/hopper_mx.h"  // OutType: the same output codes and paired stores

namespace gpuext::hopper_grouped {

// Rows of one tile (two consumer warpgroups of 64): each group is tiled on its own.
inline constexpr int kTileRows = 128;

struct Problem {
  int64_t m = 0, n = 0, k = 0, groups = 0;  // k % 128 == 0, n % 8 == 0
  hopper_mx::OutType out_type = hopper_mx::OutType::kBF16;
  const int32_t* group_sizes = nullptr;  // (G,) device
  const void* lhs = nullptr;             // (M, K) E4M3
  const float* lhs_scale = nullptr;      // (K/128, round_up(M, 4)): transposed, so TMA boxes run along M
  const void* rhs = nullptr;             // (G, N, K) E4M3
  const float* rhs_scale = nullptr;      // (G, ceil(N/128), K/128)
  void* out = nullptr;                   // (M, N)
  void* workspace = nullptr;             // WorkspaceBytes(m, groups), 16-byte aligned
};

// The tile table, its count and the group starts (csrc/ragged_dot/grouped_layout.h GroupTiles);
// jax_gpuext/ragged_dot/hopper.py computes the same size.
size_t WorkspaceBytes(int64_t m, int64_t groups);

// The size and alignment rules (TMA: 16-byte aligned bases and strides, int32 coordinates;
// paired output stores; the grid): every call checks them before launching.
Status Validate(const Problem& p);

// The tile-table kernel, the matmul kernel and the zeroing of rows past the groups, on `stream`.
// Allocates nothing and never synchronises.
Status Launch(const Problem& p, cudaStream_t stream);

// The first launch's one-time work on the current device (the shared-memory opt-in, which also
// loads the kernel, and the tensor-map encoder lookup): the handler's initialize stage calls it,
// so it never falls inside a command-buffer capture.
Status Prepare();

// True when the sm_90a kernel was compiled into this module.
bool Available();

}  // namespace gpuext::hopper_grouped
