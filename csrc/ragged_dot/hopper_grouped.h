// Our sm_90a grouped FP8 blockwise matmul for ragged_dot (docs/design.md, "Our own Hopper
// kernel" and "Grouped FP8 kernel at DeepGEMM's speed"): the DeepSeek-V3 recipe, FP8_1x128
// activations x FP8_128x128 expert weights, one persistent kernel for all groups, group sizes read
// on the device only.
//
//   out[r, n] = sum_kt s_lhs[r, kt] s_rhs[g, n/128, kt] * sum_{k in tile kt} lhs[r, k] rhs[g, n, k]
//
// for the rows r of group g: in the contiguous layout (capacity < 0) the groups follow each other,
// clamped as csrc/ragged_dot/grouped_layout.h says, and rows past the groups are written as zeros;
// in the masked layout (capacity >= 0; ragged_dot_masked) lhs is (G, capacity, K), group g owns
// rows [g * capacity, g * capacity + clamp(size_g, 0, capacity)) and the rest of its rows are
// written as zeros. Host API only: raw pointers, sizes, a stream, a Status.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "csrc/common/status.h"
#include "csrc/hopper_mx/hopper_mx.h"  // OutType: the same output codes and paired stores
#include "csrc/ragged_dot/hopper_grouped_schedule.h"  // kTileRows, the tiles, the TMA boxes

namespace gpuext::hopper_grouped {

struct Problem {
  int64_t m = 0, n = 0, k = 0, groups = 0;  // k % 16 == 0, n % 8 == 0; masked: m = groups * capacity
  int64_t capacity = -1;                    // < 0: contiguous layout; >= 0: masked, rows per group
  hopper_mx::OutType out_type = hopper_mx::OutType::kBF16;
  const int32_t* group_sizes = nullptr;  // (G,) device
  const void* lhs = nullptr;             // (M, K) E4M3
  const float* lhs_scale = nullptr;      // (ceil(K/128), round_up(M, 4)): transposed, TMA boxes run along M
  const void* rhs = nullptr;             // (G, N, K) E4M3
  const float* rhs_scale = nullptr;      // (G, ceil(N/128), ceil(K/128))
  void* out = nullptr;                   // (M, N)
  void* workspace = nullptr;             // WorkspaceBytes(m, groups), 16-byte aligned
};

// The weight gradient (RAGGED_CONTRACT, hopper_grouped_schedule.h "the weight gradient"):
//   out[g, k, n] = sum over group g's 128-token blocks b of
//                  sum_{t in block b} a[k, 128 b + t] s_a[b, k] * b[n, 128 b + t] s_b[b, n]
// with both operands in the padded slot layout (tokens contiguous, block b at [128 b, 128 b + 128),
// zeros where a block is short), group g's blocks numbered as quantize_grouped numbers them. A
// group without tokens gives a zero matrix.
struct WgradProblem {
  int64_t m = 0;       // tokens (the group sizes are clamped against it, as in ragged_m)
  int64_t k = 0, n = 0, groups = 0;
  int64_t blocks = 0;  // token blocks of the slot layout: S = 128 * blocks
  hopper_mx::OutType out_type = hopper_mx::OutType::kF32;
  const int32_t* group_sizes = nullptr;  // (G,) device
  const void* a = nullptr;               // (K, S) E4M3: x^T
  const float* a_scale = nullptr;        // (blocks, round_up(K, 4))
  const void* b = nullptr;               // (N, S) E4M3: dy^T
  const float* b_scale = nullptr;        // (blocks, round_up(N, 4))
  void* out = nullptr;                   // (G, K, N)
  void* workspace = nullptr;             // WorkspaceBytes(m, groups), 16-byte aligned
};

Status ValidateWgrad(const WgradProblem& p);

// The tile-table kernel (its per-group first tiles are the groups' token blocks) and the wgrad
// kernel, or one memset of `out` when there is nothing to contract. Allocates nothing and never
// synchronises.
Status LaunchWgrad(const WgradProblem& p, cudaStream_t stream);

// The tile table, its count, the group starts and the groups' first tiles
// (csrc/ragged_dot/grouped_layout.h GroupTiles); jax_gpuext/ragged_dot/hopper.py computes the same size.
size_t WorkspaceBytes(int64_t m, int64_t groups);

// The size and alignment rules (TMA: 16-byte aligned bases and strides, int32 coordinates;
// paired output stores; the grid): every call checks them before launching.
Status Validate(const Problem& p);

// The tile-table kernel, the persistent matmul kernel (one CTA per SM at most) and the zeroing
// of the rows no group computes, on `stream`. Allocates nothing and never synchronises.
Status Launch(const Problem& p, cudaStream_t stream);

// The first launch's one-time work on the current device (the shared-memory opt-in, which also
// loads the kernel, the SM count and the tensor-map encoder lookup): the handler's initialize stage calls it,
// so it never falls inside a command-buffer capture.
Status Prepare();

// True when the sm_90a kernel was compiled into this module.
bool Available();

}  // namespace gpuext::hopper_grouped
