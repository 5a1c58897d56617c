// Grouped (ragged) FP8 blockwise matmul through cuBLASLt's experimental grouped GEMM, whose group
// shapes and pointers live in device memory (cuBLAS >= 13.2; Hopper and the VEC128_32F /
// BLK128x128_32F scale modes from 13.4: docs/design.md, "Grouped block-scaled dot (issue 30)").
// The group sizes never reach the host: LaunchGroupedPrepare (grouped_layout.h) turns them into
// the arrays cuBLASLt reads, on the stream, so the call is the same every time and graph-safe.
//
// lhs scales are FP8_1x128 (VEC128_32F, cuBLAS's B); rhs scales per group in cuBLAS's layout for
// `rhs_scale_mode` (BLK128x128_32F: N/128 x round_up(K/128, 4) floats, K fastest; VEC128_32F:
// K/128 x N floats, N fastest), written by jax_gpuext/ragged_dot/cublaslt.py.
#pragma once

#include <library_types.h>

#include <cstdint>
#include <string>

#include "csrc/common/status.h"
#include "csrc/ragged_dot/grouped_layout.h"

namespace gpuext {

struct GroupedMatmul {
  RaggedGemm gemm;
  int rhs_scale_mode = 5;  // cublasLtMatmulMatrixScale_t: 4 VEC128_32F or 5 BLK128x128_32F
  cudaDataType_t out_type = CUDA_R_16BF;
};

// Floats of one group's rhs scales in `mode`'s layout, or 0 for a mode this path does not take.
int64_t GroupedRhsScaleFloats(int mode, int64_t n, int64_t k);

// The shape rules (K % 128, N % 8, row_align 1 or 16, sizes cuBLAS's int32 shapes can hold,
// known scale mode and output type): checked by Prepare and Run, so a hand-written call gets an
// error naming the rule.
Status CheckGroupedMatmul(const GroupedMatmul& p);

// Creates the handle of `device` (< 0: current) and asks the heuristic for p's algorithm (by
// shape, group count and average group size; no pointer is read), caching both where
// RunGroupedMatmul looks. Called at trace time and by the handler's initialize stage.
Status PrepareGroupedMatmul(const std::string& library_path, int device, const GroupedMatmul& p);

// Prepare kernels, the grouped cublasLtMatmul, finish kernel, all on `stream`. `workspace` is
// kGroupedWorkspaceAlignment-aligned and GroupedWorkspaceBytes(p.gemm) long.
Status RunGroupedMatmul(const std::string& library_path, int device_ordinal, const GroupedMatmul& p,
                        void* workspace, cudaStream_t stream);

struct GroupedPlanStats {
  int64_t plans = 0;
  int64_t built_while_running = 0;  // plans the execute path had to make (tests require 0)
};
GroupedPlanStats GetGroupedPlanStats();

}  // namespace gpuext
