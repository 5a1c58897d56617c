// The weight gradient's operands in one pass (docs/design.md, "The weight gradient's operand passes",
// "The kernel that reaches the floor"): x [m, cols] (tokens first, as x and dy come) quantized in
// FP8_1x128 along the tokens, the blocks restarting at each group, written straight into the padded
// slot layout with the tokens contiguous: codes [cols, 128 * blocks] (E4M3), scales [blocks, cols]
// (fp32). Slot block j holds rows first[j] .. first[j] + count[j] - 1 of x (one group's; count <= 128),
// zeros after: `table` is (first, count) per block, computed by XLA from the device-side group sizes.
// Replaces three passes (row gather, column quantize, code transpose: ~9 B an element at bf16) by one
// read of x and one write of the codes (~3 B).
//
// A CTA owns slot block j (blockIdx.x) x W columns (blockIdx.y): the column kernel's layout
// (cols_layout.h, FP8_1x128: 8 warps, lane l of warp w one 16-byte piece of each of 16 rows, so every
// load reads 512 contiguous bytes of a row), its column maxima and its scale rule (ComputeBlockScale,
// the same code as every other path). Each lane's 16 rows x E columns of codes are transposed in
// registers (byte permutes) into E runs of 16 tokens and staged in shared memory, one 128-byte line
// per column (its 128 tokens); the CTA then writes each line to the output as 8 consecutive 16-byte
// stores. The 16-byte slot of a run in its line is swizzled (run ^ (piece & 7)), so the 8 lanes of
// a quarter-warp that store at once hit 8 different bank groups (cols::TokenSlot, checked on the host).
//
// Bounds: rows are read only below min(first + count, m), whatever the table says (a count above 128
// or past m is clamped, a first outside [0, m) reads nothing); codes and scales are written only for
// columns below `cols`. Included by block_scaled_cuda.cu after block_scaled_cuda_kernels.h.
#pragma once

namespace gpuext::formats::vec {

struct TokenSlotsLaunch {
  const void* x = nullptr;
  const int32_t* table = nullptr;  // [blocks, 2]: first row, row count
  void* data = nullptr;            // [cols, 128 * blocks] E4M3 codes
  void* scale = nullptr;           // [blocks, cols] fp32
  int64_t m = 0, cols = 0, slots = 0;
  int32_t scale_rounding = kRoundUp;
};

template <int kIn>
using TokenSlotsShape = ColsShape<kFp8Blockwise1x128, kIn, false>;

// Byte c of each of rows 4w .. 4w + 3 (codes[row][c / 4], byte c % 4) as one word, row 4w lowest.
template <int R>
__device__ __forceinline__ uint32_t TokenWord(const uint32_t (&codes)[R][2], int w, int c) {
  const uint32_t sel = uint32_t(c % 4) | (uint32_t(c % 4 + 4) << 4);
  const uint32_t lo = __byte_perm(codes[4 * w][c / 4], codes[4 * w + 1][c / 4], sel);
  const uint32_t hi = __byte_perm(codes[4 * w + 2][c / 4], codes[4 * w + 3][c / 4], sel);
  return __byte_perm(lo, hi, 0x5410);
}

template <int kIn>
__global__ void __launch_bounds__(TokenSlotsShape<kIn>::kThreads, 2) QuantizeTokenSlotsT(TokenSlotsLaunch L) {
  using S = TokenSlotsShape<kIn>;
  constexpr int32_t kFmt = kFp8Blockwise1x128;
  constexpr int B = S::B, E = S::E, R = S::R, T = S::kCtaT, W = S::W, kP = S::kPieces;
  constexpr int kRuns = B / R;  // 16-token runs of a column line
  static_assert(S::kCtas == 1 && S::kCtaRows == B && R == 16 && kRuns == 8 && T == kRuns,
                "one CTA holds a whole 128-token block; a lane's 16 rows are one run of a line");
  static_assert(E == 4 || E == 8, "a lane's codes of one row are one or two words");
  __shared__ uint32_t colpart[T][E][kP];  // [warp along the block][column of the piece][piece]
  __shared__ SmemParams colparam[E][kP];
  __shared__ uint4 stage[W][kRuns];  // [column of the tile][swizzled 16-token slot]

  const int64_t j = blockIdx.x;
  const int2 entry = reinterpret_cast<const int2*>(L.table)[j];
  const bool in_x = entry.x >= 0 && entry.x < L.m && entry.y > 0;
  const int64_t first = in_x ? entry.x : 0;
  const int count = in_x ? int(min(min(int64_t(entry.y), int64_t(B)), L.m - first)) : 0;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rl0 = cols::RowOf<S>(warp), piece = cols::PieceOf<S>(warp, lane), run = rl0 / R;
  const int64_t col_base = int64_t(blockIdx.y) * W;
  const int64_t col = col_base + int64_t(piece) * E;
  const bool col_ok = col < L.cols;
  const int64_t elem0 = (first + rl0) * L.cols + col;  // element (first + rl0, col)
  Vec<kIn, E> v[R];
  if (col_ok && rl0 + R <= count) {
#pragma unroll
    for (int r = 0; r < R; ++r) LoadVec(L.x, elem0 + r * L.cols, v[r]);
  } else {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (col_ok && rl0 + r < count) {
        LoadVec(L.x, elem0 + r * L.cols, v[r]);
      } else {
        ZeroVec(v[r]);  // a slot past the group's rows: zero, as in the padded layout
      }
    }
  }
  PublishColumnMaxima(v, colpart[run], piece);
  __syncthreads();
  for (int c = threadIdx.x; c < W; c += S::kThreads) {
    uint32_t m = 0;
#pragma unroll
    for (int t = 0; t < T; ++t) m = max(m, colpart[t][c % E][c / E]);
    const BlockScale s = ComputeBlockScale(kFmt, L.scale_rounding, m, kF32One);
    colparam[c % E][c / E] = ToSmem(fast::ParamsOf<kFmt>(s));
    if (col_base + c < L.cols) StoreScale(L.scale, kFmt, j * L.cols + col_base + c, s.stored);
  }
  __syncthreads();
  if (col_ok) {
    uint32_t codes[R][2];
    ColumnCodes<kFmt, false, kIn, E, R, kP>(v, &colparam[0][piece], nullptr, kF32One, codes);
#pragma unroll
    for (int c = 0; c < E; ++c) {
      const int line = piece * E + c;
      stage[line][cols::TokenSlot<E>(run, line)] =
          make_uint4(TokenWord(codes, 0, c), TokenWord(codes, 1, c), TokenWord(codes, 2, c), TokenWord(codes, 3, c));
    }
  }
  __syncthreads();
  // Line by line: 8 consecutive threads write one column's 128 tokens (one 128-byte segment).
  uint8_t* out = static_cast<uint8_t*>(L.data) + j * B;
#pragma unroll
  for (int i = threadIdx.x; i < W * kRuns; i += S::kThreads) {
    const int line = i / kRuns, slot = i % kRuns;
    if (col_base + line >= L.cols) continue;
    const int tokens = 16 * cols::TokenSlot<E>(slot, line);  // the run this slot holds (the swizzle is its own inverse)
    *reinterpret_cast<uint4*>(out + (col_base + line) * L.slots + tokens) = stage[line][slot];
  }
}

}  // namespace gpuext::formats::vec
