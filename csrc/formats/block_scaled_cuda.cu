// CUDA quantize / dequantize. The fast path is the 16-byte vector kernels of
// block_scaled_cuda_kernels.h, designed from the roofline in docs/design.md ("Quantize at memory
// speed on Hopper"): a thread owns 16 elements (32 packed FP4) along the last axis, block scales by
// the scalar rule once per block, elements by block_scaled_fast.h. The kernels below are the generic
// path kept for what those do not take (rows or inner sizes not a multiple of 16 / 32, misaligned
// buffers, more than 2^32 chunks): slower, the same rules, the same bits.
// Rules: block_scaled_math.h (the same code the CPU handler runs). FP4 packing: block_scaled_io.h.
//
// Generic kernels:
//  - QuantizeRows1d: contiguous blocks (inner == 1, K % 8 == 0): a thread owns 8 consecutive
//    elements, block/8 lanes of a warp share one block and reduce its amax with shuffles.
//  - QuantizeStrided1d: any other 1-D layout: a thread owns one block column (adjacent threads
//    take adjacent inner indices, so loads coalesce); it reads its block twice (second time L1/L2).
//    Packed FP4 here ORs nibbles into aligned words; QuantizeStridedFp4Tail writes the last
//    (bytes % 4) bytes, whose word would reach past the buffer.
//  - QuantizeTiles128: FP8_128x128: one 256-thread CTA per tile, 64 values per thread in registers.
//  - FP8_TENSOR cannot be one pass: no element can be rounded before the whole tensor's amax is
//    known. Three stream-ordered kernels (no host sync, so CUDA-graph safe): TensorAmax reduces
//    |x| bits into the zeroed scale slots with atomicMax, QuantizeTensor rounds each element with
//    the scale derived from its tensor's amax, FinalizeTensorScale overwrites each amax with the
//    scale. The input is read twice: 2 reads + 1 write is the floor for per-tensor scaling.
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

#include "csrc/common/cuda_check.h"
#include "csrc/formats/block_scaled_cuda.h"
#include "csrc/formats/block_scaled_cuda_kernels.h"
#include "csrc/formats/block_scaled_io.h"
#include "csrc/formats/token_slots_kernel.cuh"

namespace gpuext::formats {
namespace {

constexpr int kChunk = 8;  // elements per thread in the row kernels

// Geometry the kernels would otherwise recompute in every thread, with 64-bit integer divisions
// (tens of instructions each on the GPU): computed once on the host and passed by value.
struct Hoisted {
  int64_t blocks_along;     // blocks (128-row tiles for FP8_128x128) along K
  int64_t row_len;          // elements per outer index: K * inner, or M * N for FP8_128x128
  int64_t rows_per_global;  // outer indices sharing one NVFP4 global scale (vmap's batch)
};

Hoisted HoistedOf(const BlockScaledGeometry& g) {
  return {g.blocks_along(), g.two_d() ? g.k * g.cols : g.k * g.inner, g.outer / g.global_count};
}

// Only NVFP4 has a global scale: every other format ignores it, so skip its load and division.
__device__ __forceinline__ uint32_t GlobalBits(const BlockScaledGeometry& g, const Hoisted& h, const float* gs,
                                               int64_t outer_index) {
  if (g.format != kNvfp4 || gs == nullptr) return kF32One;
  return __float_as_uint(gs[outer_index / h.rows_per_global]);
}

__device__ __forceinline__ void LoadChunk(const void* x, FloatType t, int64_t i, uint32_t (&v)[kChunk]) {
  if (t == FloatType::kF32) {
    const uint4* p = reinterpret_cast<const uint4*>(static_cast<const uint32_t*>(x) + i);
    const uint4 a = p[0], b = p[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
    const uint4 a = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(x) + i);
    const uint32_t w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      v[2 * j] = w[j] & 0xFFFFu;
      v[2 * j + 1] = w[j] >> 16;
    }
#pragma unroll
    for (int j = 0; j < kChunk; ++j)
      v[j] = t == FloatType::kBF16 ? v[j] << 16 : HalfToF32Bits(v[j]);
  }
}

// Stores 8 element codes starting at element i (i % 8 == 0): 8 bytes, or 4 packed FP4 bytes.
__device__ __forceinline__ void StoreChunk(void* data, bool fp4_packed, int64_t i, const uint32_t (&c)[kChunk]) {
  if (fp4_packed) {
    uint32_t w = 0;
#pragma unroll
    for (int j = 0; j < kChunk; j += 2) w |= Fp4PackPair(c[j], c[j + 1]) << (4 * j);
    reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(data) + i / 2)[0] = w;
  } else {
    uint2 w{0, 0};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      w.x |= (c[j] & 0xFFu) << (8 * j);
      w.y |= (c[j + 4] & 0xFFu) << (8 * j);
    }
    *reinterpret_cast<uint2*>(static_cast<uint8_t*>(data) + i) = w;
  }
}

template <int kLanes>  // lanes per block = block / 8: 2 (NVFP4), 4 (MX), 16 (1x128)
__global__ void QuantizeRows1d(QuantizeArgs a, Hoisted h, int64_t chunks_per_row_padded, int64_t total_threads) {
  const BlockScaledGeometry& g = a.geo;
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t row = t / chunks_per_row_padded, c = t % chunks_per_row_padded;
  const bool active = t < total_threads && c * kChunk < g.k;
  uint32_t v[kChunk] = {0, 0, 0, 0, 0, 0, 0, 0};
  const int64_t first = row * g.k + c * kChunk;
  uint32_t amax = 0;
  if (active) {
    LoadChunk(a.x, a.in_type, first, v);
#pragma unroll
    for (int j = 0; j < kChunk; ++j) amax = max(amax, v[j] & kF32AbsMask);
  }
#pragma unroll
  for (int off = kLanes / 2; off > 0; off >>= 1) amax = max(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
  if (!active) return;
  const BlockScale s = ComputeBlockScale(g.format, a.scale_rounding, amax, GlobalBits(g, h, a.global_scale, row));
  const int64_t block_in_row = c / kLanes;
  if (c % kLanes == 0) StoreScale(a.scale, g.format, row * h.blocks_along + block_in_row, s.stored);
  uint32_t codes[kChunk];
#pragma unroll
  for (int j = 0; j < kChunk; ++j) codes[j] = QuantizeElement(g.format, s, v[j]);
  StoreChunk(a.data, g.fp4_packed, first, codes);
}

// Packed FP4 from the strided kernel: neighbouring threads share bytes, so OR nibbles into a
// zeroed buffer atomically (the rare strided-NVFP4 case pays one memset). Only bytes below
// `first_tail_byte` go this way: their aligned 32-bit word lies inside the buffer. The last
// (bytes % 4) bytes would need a word reaching past the end, so QuantizeStridedFp4Tail writes them.
__device__ __forceinline__ void StoreCodeStrided(void* data, bool fp4_packed, int64_t first_tail_byte, int64_t i,
                                                 uint32_t code) {
  if (!fp4_packed) {
    static_cast<uint8_t*>(data)[i] = uint8_t(code);
    return;
  }
  const int64_t byte = i >> 1;
  if (byte >= first_tail_byte) return;
  const uint32_t shift = uint32_t((byte & 3) * 8 + (i & 1) * 4);
  atomicOr(reinterpret_cast<unsigned int*>(static_cast<uint8_t*>(data) + (byte & ~int64_t(3))), (code & 0xFu) << shift);
}

// The scale of block `b` of column (o, i) in the strided layout: the amax over its elements.
__device__ __forceinline__ BlockScale StridedBlockScale(const QuantizeArgs& a, const Hoisted& h, int64_t o, int64_t b,
                                                        int64_t i) {
  const BlockScaledGeometry& g = a.geo;
  const int64_t begin = b * g.block, end = min(g.k, begin + g.block);
  uint32_t amax = 0;
  for (int64_t kk = begin; kk < end; ++kk)
    amax = max(amax, LoadInputBits(a.x, a.in_type, (o * g.k + kk) * g.inner + i) & kF32AbsMask);
  return ComputeBlockScale(g.format, a.scale_rounding, amax, GlobalBits(g, h, a.global_scale, o));
}

__global__ void QuantizeStrided1d(QuantizeArgs a, Hoisted h, int64_t columns, int64_t first_tail_byte) {
  const BlockScaledGeometry& g = a.geo;
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= columns) return;
  const int64_t i = t % g.inner, ob = t / g.inner;  // ob = o * blocks_along + b
  const int64_t b = ob % h.blocks_along, o = ob / h.blocks_along;
  const BlockScale s = StridedBlockScale(a, h, o, b, i);
  StoreScale(a.scale, g.format, t, s.stored);
  const int64_t begin = b * g.block, end = min(g.k, begin + g.block);
  for (int64_t kk = begin; kk < end; ++kk) {
    const int64_t e = (o * g.k + kk) * g.inner + i;
    StoreCodeStrided(a.data, g.fp4_packed, first_tail_byte, e,
                     QuantizeElement(g.format, s, LoadInputBits(a.x, a.in_type, e)));
  }
}

// Packed FP4, strided: the bytes from `first_tail_byte` to the end (at most 3), one thread per
// byte writing both nibbles, each element's block scale recomputed (a block is at most 16 reads).
// Runs after QuantizeStrided1d, which wrote every scale and skipped these bytes.
__global__ void QuantizeStridedFp4Tail(QuantizeArgs a, Hoisted h, int64_t first_tail_byte, int64_t bytes) {
  const BlockScaledGeometry& g = a.geo;
  const int64_t byte = first_tail_byte + threadIdx.x;
  if (byte >= bytes) return;
  uint32_t packed = 0;
  for (int64_t e = 2 * byte; e < min(2 * byte + 2, g.elements()); ++e) {
    const int64_t i = e % g.inner, kk = (e / g.inner) % g.k, o = e / (g.inner * g.k);
    const BlockScale s = StridedBlockScale(a, h, o, kk / g.block, i);
    packed |= (QuantizeElement(g.format, s, LoadInputBits(a.x, a.in_type, e)) & 0xFu) << (4 * (e & 1));
  }
  static_cast<uint8_t*>(a.data)[byte] = uint8_t(packed);
}

constexpr int kTileThreads = 256;  // two threads per tile column, 64 rows each

__global__ void QuantizeTiles128(QuantizeArgs a, Hoisted h) {
  const BlockScaledGeometry& g = a.geo;
  const int64_t tile = blockIdx.x;
  const int64_t bc = tile % g.block_cols(), obr = tile / g.block_cols();  // obr = o * blocks_along + br
  const int64_t br = obr % h.blocks_along, o = obr / h.blocks_along;
  const int col = threadIdx.x % 128, half = threadIdx.x / 128;  // two threads per column, 64 rows each
  const int64_t c = bc * 128 + col;
  uint32_t v[64];
  uint32_t amax = 0;
#pragma unroll
  for (int j = 0; j < 64; ++j) {
    const int64_t r = br * 128 + half * 64 + j;
    v[j] = (c < g.cols && r < g.k) ? LoadInputBits(a.x, a.in_type, (o * g.k + r) * g.cols + c) : 0u;
    amax = max(amax, v[j] & kF32AbsMask);
  }
  for (int off = 16; off > 0; off >>= 1) amax = max(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
  __shared__ uint32_t warp_amax[kTileThreads / 32];
  if (threadIdx.x % 32 == 0) warp_amax[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = 0;
#pragma unroll
  for (int w = 0; w < kTileThreads / 32; ++w) amax = max(amax, warp_amax[w]);
  const BlockScale s = ComputeBlockScale(g.format, a.scale_rounding, amax, kF32One);
  if (threadIdx.x == 0) StoreScale(a.scale, g.format, tile, s.stored);
#pragma unroll
  for (int j = 0; j < 64; ++j) {
    const int64_t r = br * 128 + half * 64 + j;
    if (c < g.cols && r < g.k)
      static_cast<uint8_t*>(a.data)[(o * g.k + r) * g.cols + c] = uint8_t(QuantizeElement(g.format, s, v[j]));
  }
}

// FP8_TENSOR. blockIdx.y walks the tensors (vmap's batch); x-blocks stride over one tensor's
// elements, kVec: 8 per step (aligned, K % 8 == 0), else one.
template <bool kVec>
__global__ void TensorAmax(QuantizeArgs a) {
  const BlockScaledGeometry& g = a.geo;
  const int64_t step = int64_t(gridDim.x) * blockDim.x * (kVec ? kChunk : 1);
  for (int64_t o = blockIdx.y; o < g.outer; o += gridDim.y) {
    uint32_t amax = 0;
    for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * (kVec ? kChunk : 1); i < g.k; i += step) {
      if constexpr (kVec) {
        uint32_t v[kChunk];
        LoadChunk(a.x, a.in_type, o * g.k + i, v);
#pragma unroll
        for (int j = 0; j < kChunk; ++j) amax = max(amax, v[j] & kF32AbsMask);
      } else {
        amax = max(amax, LoadInputBits(a.x, a.in_type, o * g.k + i) & kF32AbsMask);
      }
    }
    for (int off = 16; off > 0; off >>= 1) amax = max(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));
    if (threadIdx.x % 32 == 0 && amax != 0) atomicMax(static_cast<unsigned int*>(a.scale) + o, amax);
  }
}

template <bool kVec>
__global__ void QuantizeTensor(QuantizeArgs a) {
  const BlockScaledGeometry& g = a.geo;
  const int64_t step = int64_t(gridDim.x) * blockDim.x * (kVec ? kChunk : 1);
  for (int64_t o = blockIdx.y; o < g.outer; o += gridDim.y) {
    // The slot still holds the amax: FinalizeTensorScale runs after this kernel.
    const uint32_t amax = static_cast<const uint32_t*>(a.scale)[o];
    const BlockScale s = ComputeBlockScale(g.format, a.scale_rounding, amax, kF32One);
    for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * (kVec ? kChunk : 1); i < g.k; i += step) {
      const int64_t e = o * g.k + i;
      if constexpr (kVec) {
        uint32_t v[kChunk], codes[kChunk];
        LoadChunk(a.x, a.in_type, e, v);
#pragma unroll
        for (int j = 0; j < kChunk; ++j) codes[j] = QuantizeElement(g.format, s, v[j]);
        StoreChunk(a.data, false, e, codes);
      } else {
        static_cast<uint8_t*>(a.data)[e] = uint8_t(QuantizeElement(g.format, s, LoadInputBits(a.x, a.in_type, e)));
      }
    }
  }
}

__global__ void FinalizeTensorScale(QuantizeArgs a) {
  const int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (o >= a.geo.outer) return;
  uint32_t* slot = static_cast<uint32_t*>(a.scale) + o;
  *slot = ComputeBlockScale(a.geo.format, a.scale_rounding, *slot, kF32One).stored;
}

// Index of the scale of element e (any layout).
__device__ __forceinline__ int64_t ScaleIndexOf(const BlockScaledGeometry& g, const Hoisted& h, int64_t e,
                                                int64_t* outer) {
  const int64_t o = e / h.row_len, rest = e % h.row_len;
  *outer = o;
  if (g.two_d()) return (o * h.blocks_along + (rest / g.cols) / 128) * g.block_cols() + (rest % g.cols) / 128;
  return (o * h.blocks_along + (rest / g.inner) / g.block) * g.inner + rest % g.inner;
}

__global__ void Dequantize(DequantizeArgs a, Hoisted h) {
  const BlockScaledGeometry& g = a.geo;
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= g.elements()) return;
  int64_t o;
  const int64_t s = ScaleIndexOf(g, h, e, &o);
  const uint32_t bits = DequantizeElement(g.format, LoadElementCode(a.data, g.fp4_packed, e),
                                          LoadScale(a.scale, g.format, s), GlobalBits(g, h, a.global_scale, o),
                                          OutputFormat(a.out_type));
  StoreOutput(a.y, a.out_type, e, bits);
}

// Contiguous runs of 8 (Vectorizable below): the 8 elements share one scale, so a thread loads it
// once, reads its codes as one 8-byte (or 4-byte packed FP4) word and writes one 16-byte (bf16 /
// f16) or two 16-byte (f32) vectors, instead of eight byte loads and eight narrow stores.
__global__ void DequantizeChunks(DequantizeArgs a, Hoisted h, int64_t chunks) {
  const BlockScaledGeometry& g = a.geo;
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= chunks) return;
  const int64_t e0 = t * kChunk;
  int64_t o;
  const int64_t s = ScaleIndexOf(g, h, e0, &o);
  const uint32_t scale = LoadScale(a.scale, g.format, s), gbits = GlobalBits(g, h, a.global_scale, o);
  const BitFormat out = OutputFormat(a.out_type);
  uint32_t codes[kChunk];
  if (g.fp4_packed) {
    const uint32_t w = reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(a.data) + e0 / 2)[0];
#pragma unroll
    for (int j = 0; j < kChunk; ++j) codes[j] = (w >> (4 * j)) & 0xFu;
  } else {
    const uint2 w = *reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(a.data) + e0);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      codes[j] = (w.x >> (8 * j)) & 0xFFu;
      codes[j + 4] = (w.y >> (8 * j)) & 0xFFu;
    }
  }
  uint32_t y[kChunk];
#pragma unroll
  for (int j = 0; j < kChunk; ++j) y[j] = DequantizeElement(g.format, codes[j], scale, gbits, out);
  if (a.out_type == FloatType::kF32) {
    uint4* p = reinterpret_cast<uint4*>(static_cast<uint32_t*>(a.y) + e0);
    p[0] = make_uint4(y[0], y[1], y[2], y[3]);
    p[1] = make_uint4(y[4], y[5], y[6], y[7]);
  } else {
    *reinterpret_cast<uint4*>(static_cast<uint16_t*>(a.y) + e0) =
        make_uint4(y[0] | (y[1] << 16), y[2] | (y[3] << 16), y[4] | (y[5] << 16), y[6] | (y[7] << 16));
  }
}

int64_t Blocks(int64_t n, int threads) { return (n + threads - 1) / threads; }

bool Aligned(const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// ---------------------------------------------------------------------------- vector kernels
template <int32_t F>
using FormatC = std::integral_constant<int32_t, F>;
template <int K>
using KindC = std::integral_constant<int, K>;

// Calls f(FormatC<format>) for a runtime format code; false for an unknown one.
template <class Fn>
bool WithFormat(int32_t format, Fn&& f) {
  switch (format) {
    case kMxfp8E4m3: f(FormatC<kMxfp8E4m3>{}); return true;
    case kMxfp8E5m2: f(FormatC<kMxfp8E5m2>{}); return true;
    case kNvfp4: f(FormatC<kNvfp4>{}); return true;
    case kFp8Blockwise1x128: f(FormatC<kFp8Blockwise1x128>{}); return true;
    case kFp8Blockwise128x128: f(FormatC<kFp8Blockwise128x128>{}); return true;
    case kFp8PerTensor: f(FormatC<kFp8PerTensor>{}); return true;
    case kMxfp4: f(FormatC<kMxfp4>{}); return true;
    default: return false;
  }
}

template <class Fn>
void WithKind(FloatType t, Fn&& f) {
  switch (t) {
    case FloatType::kF32: f(KindC<vec::kInF32>{}); break;
    case FloatType::kBF16: f(KindC<vec::kInBf16>{}); break;
    default: f(KindC<vec::kInF16>{}); break;
  }
}

// Grid-stride kernels get one full wave: as many CTAs as the SMs hold at once for that kernel (its
// registers and shared memory decide: 3-8 CTAs of 256 threads on sm_90), never more than the work
// needs. Assuming 2048 threads per SM gave kernels that fit 5-6 CTAs a wave and a third to a wave and
// a half, and the last part ran alone on a fraction of the machine, with less in flight than the
// memory system needs (round 2, docs/design.md). The occupancy query enqueues nothing, so it is
// allowed while a stream is captured.
template <class Kernel>
int64_t GridFor(Kernel kernel, int64_t items, int threads) {
  int dev = 0, sms = 0, per_sm = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      sms <= 0)
    sms = 132;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0) != cudaSuccess || per_sm <= 0) {
    (void)cudaGetLastError();  // not the launch's error: fall back to a full SM's worth
    per_sm = 2048 / threads;
  }
  const int64_t fill = int64_t(sms) * per_sm;
  return std::max<int64_t>(1, std::min<int64_t>(Blocks(items, threads), fill));
}

constexpr int64_t kMaxChunks32 = int64_t(1) << 31;  // FastDiv's range, with room

// The vector kernels take 1-D formats with FP4 packed (XLA's CUDA layout; one-per-byte FP4 takes the
// generic kernels) and buffers aligned for 16-byte access.
bool VecFormatOk(const BlockScaledGeometry& g) { return !IsFp4(g.format) || g.fp4_packed; }
int VecLenOf(const BlockScaledGeometry& g) { return vec::VecLen(g.format, g.fp4_packed); }

// Along the last axis (inner == 1). *taken = false: not this kernel's layout (the caller goes generic).
Status LaunchRowsVec(cudaStream_t stream, const QuantizeArgs& a, bool* taken) {
  const BlockScaledGeometry& g = a.geo;
  *taken = false;
  if (g.per_tensor() || g.two_d() || g.inner != 1 || !VecFormatOk(g)) return Status::Ok();
  const int64_t v = VecLenOf(g), b = vec::BlockLen(g.format), lanes = b >= v ? b / v : 1;
  if (g.k % v != 0 || !Aligned(a.x, 16) || !Aligned(a.data, 16)) return Status::Ok();
  const int64_t groups = g.format == kNvfp4 ? g.global_count : 1;
  if (groups > 65535) return Status::Ok();
  vec::RowsLaunch L;
  L.k = g.k;
  L.blocks_along = g.blocks_along();
  L.rows_per_group = g.outer / groups;
  L.ragged = g.k % b != 0;
  L.chunks_per_row = L.ragged ? (g.k / v + lanes - 1) / lanes * lanes : g.k / v;
  const int64_t total = L.rows_per_group * L.chunks_per_row;
  if (L.ragged && (total >= kMaxChunks32 || L.chunks_per_row >= kMaxChunks32)) return Status::Ok();
  L.per_row = vec::FastDiv(uint32_t(L.ragged ? L.chunks_per_row : 1));
  WithFormat(g.format, [&](auto fc) {
    constexpr int32_t F = decltype(fc)::value;
    if constexpr (F != kFp8PerTensor && F != kFp8Blockwise128x128) {
      WithKind(a.in_type, [&](auto kc) {
        const auto kernel = vec::QuantizeRowsVec<F, decltype(kc)::value, fast::kFp4(F)>;
        const dim3 grid(unsigned(GridFor(kernel, total, vec::kThreads)), unsigned(groups));
        kernel<<<grid, vec::kThreads, 0, stream>>>(a, L);
      });
    }
  });
  *taken = true;
  GPUEXT_CUDA_RETURN_IF_LAUNCH_ERROR("QuantizeRowsVec");
  return Status::Ok();
}

// Whether the code the driver loaded for `kernel` on the current device was compiled for sm_90 or
// later (cluster launches, distributed shared memory): the sm_90a / sm_100a cubins, not the sm_80
// cubin or the compute_80 PTX a newer device without its own cubin JIT-compiles; and whether the
// device takes cluster launches at all (not under every MIG / vGPU setup). Runtime lookups, no device
// work; the answer is kept per (kernel, device).
bool ClusterCodeLoaded(const void* kernel) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();  // leaves no error behind for the launch checks that follow
    return false;
  }
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, bool> known;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(kernel, device);
  if (const auto it = known.find(key); it != known.end()) return it->second;
  int cluster_launch = 0;
  cudaFuncAttributes attr{};
  if (cudaDeviceGetAttribute(&cluster_launch, cudaDevAttrClusterLaunch, device) != cudaSuccess ||
      cudaFuncGetAttributes(&attr, kernel) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;  // not remembered: a transient failure is asked again
  }
  const bool ok = cluster_launch != 0 && attr.ptxVersion >= 90 && attr.binaryVersion >= 90;
  known.emplace(key, ok);
  return ok;
}

// `kernel` on a grid of clusters of `ctas` CTAs along x (grid.x a multiple of it). A launch
// attribute, not __cluster_dims__, so the kernel still compiles for sm_80 (where it is never run).
template <class... Params, class... Args>
cudaError_t LaunchCluster(void (*kernel)(Params...), dim3 grid, int threads, int ctas, cudaStream_t stream,
                          Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(unsigned(threads), 1u, 1u);
  config.stream = stream;  // no dynamic shared memory (zeroed above)
  cudaLaunchAttribute cluster[1];
  cluster[0].id = cudaLaunchAttributeClusterDimension;
  cluster[0].val.clusterDim.x = unsigned(ctas);
  cluster[0].val.clusterDim.y = 1;
  cluster[0].val.clusterDim.z = 1;
  config.attrs = cluster;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// Along a non-last axis (inner > 1, blocks down K); with `rows` (quantize_both_axes: the same x along
// its last axis, inner == N) the fused kernel writes both from one read of x.
Status LaunchColsVec(cudaStream_t stream, const QuantizeArgs& a, const QuantizeArgs* rows, bool* taken) {
  const BlockScaledGeometry& g = a.geo;
  *taken = false;
  if (g.per_tensor() || g.two_d() || g.inner <= 1 || !VecFormatOk(g)) return Status::Ok();
  // a lane loads one 16-byte piece (e elements) of a row and stores its codes in one access
  const int64_t e = 16 / (a.in_type == FloatType::kF32 ? 4 : 2);
  const int64_t code_align = g.fp4_packed ? e / 2 : e;
  if (g.inner % e != 0 || !Aligned(a.x, 16) || !Aligned(a.data, code_align)) return Status::Ok();
  if (rows != nullptr && !Aligned(rows->data, code_align)) return Status::Ok();
  const int64_t block_rows = g.outer * g.blocks_along();
  if (block_rows >= kMaxChunks32 / 2) return Status::Ok();  // grid.x: block_rows x CTAs per block-row
  vec::ColsLaunch L;
  L.k = g.k;
  L.inner = g.inner;
  L.blocks_along = g.blocks_along();
  L.rows_per_global = g.outer / g.global_count;
  L.row_blocks_along = (g.inner + vec::BlockLen(g.format) - 1) / vec::BlockLen(g.format);
  bool fits = true;
  cudaError_t launch_error = cudaSuccess;
  WithFormat(g.format, [&](auto fc) {
    constexpr int32_t F = decltype(fc)::value;
    if constexpr (F != kFp8PerTensor && F != kFp8Blockwise128x128) {
      WithKind(a.in_type, [&](auto kc) {
        constexpr int K = decltype(kc)::value;
        const auto launch = [&](auto both, const QuantizeArgs& second) {
          constexpr bool kBoth = decltype(both)::value;
          using S = vec::ColsShape<F, K, kBoth>;
          const int64_t col_tiles = (g.inner + S::W - 1) / S::W;
          if (col_tiles > 65535) {
            fits = false;
            return;
          }
          const auto kernel = vec::QuantizeColsVec<F, K, fast::kFp4(F), kBoth>;
          const dim3 grid{unsigned(block_rows * S::kCtas), unsigned(col_tiles), 1u};
          if constexpr (S::kCtas == 1) {
            kernel<<<grid, S::kThreads, 0, stream>>>(a, second, L);
          } else {
            if (!ClusterCodeLoaded(reinterpret_cast<const void*>(kernel))) {
              fits = false;  // the two axes apart (QuantizeBothAxesCuda)
              return;
            }
            launch_error = LaunchCluster(kernel, grid, S::kThreads, S::kCtas, stream, a, second, L);
          }
        };
        if (rows != nullptr) {
          launch(std::true_type{}, *rows);
        } else {
          launch(std::false_type{}, a);
        }
      });
    }
  });
  if (!fits) return Status::Ok();
  *taken = true;
  if (launch_error != cudaSuccess) {
    (void)cudaGetLastError();  // reported here, not against the next launch
    GPUEXT_CUDA_RETURN_IF_ERROR(launch_error);
  }
  GPUEXT_CUDA_RETURN_IF_LAUNCH_ERROR("QuantizeColsVec");
  return Status::Ok();
}

Status LaunchTilesVec(cudaStream_t stream, const QuantizeArgs& a, bool* taken) {
  const BlockScaledGeometry& g = a.geo;
  *taken = false;
  if (g.cols % 16 != 0 || !Aligned(a.x, 16) || !Aligned(a.data, 16)) return Status::Ok();
  const int64_t tiles = g.outer * g.blocks_along() * g.block_cols();
  if (tiles >= kMaxChunks32) return Status::Ok();
  WithKind(a.in_type, [&](auto kc) {
    constexpr int K = decltype(kc)::value;
    vec::QuantizeTilesVec<K><<<unsigned(tiles), vec::TileShape<K>::kThreadsPerTile, 0, stream>>>(a, g.blocks_along());
  });
  *taken = true;
  GPUEXT_CUDA_RETURN_IF_LAUNCH_ERROR("QuantizeTilesVec");
  return Status::Ok();
}

// Dequantize, any layout the vector kernel covers: rows of row_len elements (K; N for FP8_128x128;
// inner for blocks down a non-last axis), row_len a multiple of E (8 outputs per 16-byte store,
// 4 for f32); the codes, outputs (and, down the columns, the scales) aligned for vector access.
Status LaunchDequantVec(cudaStream_t stream, const DequantizeArgs& a, bool* taken) {
  const BlockScaledGeometry& g = a.geo;
  *taken = false;
  if (!VecFormatOk(g)) return Status::Ok();
  const int layout = g.two_d() ? vec::kDeqTiles : (g.per_tensor() || g.inner == 1 ? vec::kDeqRows : vec::kDeqCols);
  const int64_t e = a.out_type == FloatType::kF32 ? 4 : 8;
  const int64_t row_len = layout == vec::kDeqTiles ? g.cols : (layout == vec::kDeqRows ? g.k : g.inner);
  const int64_t n = g.elements();
  if (row_len <= 0 || row_len % e != 0 || n / e >= kMaxChunks32 || g.k >= kMaxChunks32 || !Aligned(a.data, 16) ||
      !Aligned(a.y, 16) || (layout == vec::kDeqCols && !Aligned(a.scale, 16)))
    return Status::Ok();
  vec::DeqLaunch L;
  L.pieces = n / e;
  L.row_len = row_len;
  L.k = g.k;
  L.blocks_along = g.blocks_along();
  L.tile_cols = g.block_cols();
  L.per_row = vec::FastDiv(uint32_t(row_len / e));
  L.per_k = vec::FastDiv(uint32_t(layout == vec::kDeqRows ? 1 : g.k));
  L.per_global = vec::FastDiv(uint32_t(g.format == kNvfp4 ? g.outer / g.global_count : 1));
  // one thread per U pieces (vec::DeqShape::U: 4, 2 down the columns) a span
  const int64_t threads_needed = (L.pieces + (layout == vec::kDeqCols ? 1 : 3)) / (layout == vec::kDeqCols ? 2 : 4);
  auto launch = [&](auto kernel) {
    kernel<<<unsigned(GridFor(kernel, threads_needed, vec::kThreads)), vec::kThreads, 0, stream>>>(a, L);
  };
  WithFormat(g.format, [&](auto fc) {
    constexpr int32_t F = decltype(fc)::value;
    WithKind(a.out_type, [&](auto kc) {
      constexpr int K = decltype(kc)::value;
      constexpr bool P = fast::kFp4(F);
      if constexpr (F == kFp8Blockwise128x128) {
        launch(vec::DequantVec<F, K, P, vec::kDeqTiles>);
      } else if constexpr (F == kFp8PerTensor) {
        launch(vec::DequantVec<F, K, P, vec::kDeqRows>);
      } else if (layout == vec::kDeqRows) {
        launch(vec::DequantVec<F, K, P, vec::kDeqRows>);
      } else {
        launch(vec::DequantVec<F, K, P, vec::kDeqCols>);
      }
    });
  });
  *taken = true;
  GPUEXT_CUDA_RETURN_IF_LAUNCH_ERROR("DequantVec");
  return Status::Ok();
}

Status QuantizePerTensor(cudaStream_t stream, const QuantizeArgs& a) {
  const BlockScaledGeometry& g = a.geo;
  if (g.outer == 0) return Status::Ok();
  // amax slots start at +0.0 bits: an empty or all-zero tensor keeps amax 0 (scale 1).
  GPUEXT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(a.scale, 0, size_t(g.outer) * sizeof(uint32_t), stream));
  if (g.k > 0) {
    constexpr int kThreads = 256;
    if (g.k % 16 == 0 && Aligned(a.x, 16) && Aligned(a.data, 16)) {
      // 16 elements per thread, 16-byte loads and stores (docs/design.md, issue 35)
      const unsigned tensors = unsigned(std::min<int64_t>(g.outer, 65535));
      WithKind(a.in_type, [&](auto kc) {
        const auto kernel = vec::TensorAmaxVec<decltype(kc)::value>;
        kernel<<<dim3(unsigned(GridFor(kernel, g.k / 16, vec::kThreads)), tensors), vec::kThreads, 0, stream>>>(a);
      });
      GPUEXT_CUDA_RETURN_IF_LAUNCH_ERROR("TensorAmaxVec");
      WithKind(a.in_type, [&](auto kc) {
        const auto kernel = vec::QuantizeTensorVec<decltype(kc)::value>;
        kernel<<<dim3(unsigned(GridFor(kernel, g.k / 16, vec::kThreads)), tensors), vec::kThreads, 0, stream>>>(a);
      });
      GPUEXT_CUDA_RETURN_IF_LAUNCH_ERROR("QuantizeTensorVec");
      FinalizeTensorScale<<<unsigned(Blocks(g.outer, 256)), 256, 0, stream>>>(a);
      GPUEXT_CUDA_RETURN_IF_LAUNCH_ERROR("FinalizeTensorScale");
      return Status::Ok();
    }
    const bool vec = g.k % kChunk == 0 && Aligned(a.x, 16) && Aligned(a.data, 8);
    const int64_t per_step = int64_t(kThreads) * (vec ? kChunk : 1);
    // Enough CTAs to fill the GPU a few times over, never more than the elements need.
    const int64_t x_blocks = std::min<int64_t>(Blocks(g.k, int(per_step)), 1024);
    const dim3 grid(unsigned(x_blocks), unsigned(std::min<int64_t>(g.outer, 65535)));
    if (vec) {
      TensorAmax<true><<<grid, kThreads, 0, stream>>>(a);
      GPUEXT_CUDA_RETURN_IF_LAUNCH_ERROR("TensorAmax");
      QuantizeTensor<true><<<grid, kThreads, 0, stream>>>(a);
    } else {
      TensorAmax<false><<<grid, kThreads, 0, stream>>>(a);
      GPUEXT_CUDA_RETURN_IF_LAUNCH_ERROR("TensorAmax");
      QuantizeTensor<false><<<grid, kThreads, 0, stream>>>(a);
    }
    GPUEXT_CUDA_RETURN_IF_LAUNCH_ERROR("QuantizeTensor");
  }
  FinalizeTensorScale<<<unsigned(Blocks(g.outer, 256)), 256, 0, stream>>>(a);
  GPUEXT_CUDA_RETURN_IF_LAUNCH_ERROR("FinalizeTensorScale");
  return Status::Ok();
}

}  // namespace

Status QuantizeCuda(cudaStream_t stream, const QuantizeArgs& a) {
  const BlockScaledGeometry& g = a.geo;
  if (g.per_tensor()) return QuantizePerTensor(stream, a);  // writes scales even for empty tensors
  if (g.elements() == 0) return Status::Ok();
  constexpr int kThreads = 256;
  const Hoisted h = HoistedOf(g);
  bool taken = false;
  if (g.two_d()) {
    GPUEXT_RETURN_IF_ERROR(LaunchTilesVec(stream, a, &taken));
    if (taken) return Status::Ok();
    const int64_t tiles = g.outer * h.blocks_along * g.block_cols();
    QuantizeTiles128<<<unsigned(tiles), kTileThreads, 0, stream>>>(a, h);
    GPUEXT_CUDA_RETURN_IF_LAUNCH_ERROR("QuantizeTiles128");
    return Status::Ok();
  }
  GPUEXT_RETURN_IF_ERROR(LaunchRowsVec(stream, a, &taken));
  if (taken) return Status::Ok();
  GPUEXT_RETURN_IF_ERROR(LaunchColsVec(stream, a, nullptr, &taken));
  if (taken) return Status::Ok();
  const bool vector_ok = g.inner == 1 && g.k % kChunk == 0 && Aligned(a.x, 16) && Aligned(a.data, 8);
  if (vector_ok) {
    const int lanes = int(g.block / kChunk);
    const int64_t chunks = (g.k / kChunk + lanes - 1) / lanes * lanes;
    const int64_t total = g.outer * chunks;
    const unsigned grid = unsigned(Blocks(total, kThreads));
    switch (lanes) {
      case 2: QuantizeRows1d<2><<<grid, kThreads, 0, stream>>>(a, h, chunks, total); break;
      case 4: QuantizeRows1d<4><<<grid, kThreads, 0, stream>>>(a, h, chunks, total); break;
      default: QuantizeRows1d<16><<<grid, kThreads, 0, stream>>>(a, h, chunks, total); break;
    }
    GPUEXT_CUDA_RETURN_IF_LAUNCH_ERROR("QuantizeRows1d");
    return Status::Ok();
  }
  const int64_t bytes = (g.elements() + 1) / 2;  // packed FP4
  int64_t first_tail_byte = bytes;
  if (g.fp4_packed) {
    // The atomics address aligned words from the buffer start (XLA aligns buffers far beyond 4).
    if (!Aligned(a.data, 4)) return Status::Error("packed FP4 output buffer is not 4-byte aligned");
    first_tail_byte = bytes & ~int64_t(3);
    GPUEXT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(a.data, 0, size_t(first_tail_byte), stream));
  }
  const int64_t columns = g.outer * h.blocks_along * g.inner;
  QuantizeStrided1d<<<unsigned(Blocks(columns, kThreads)), kThreads, 0, stream>>>(a, h, columns, first_tail_byte);
  GPUEXT_CUDA_RETURN_IF_LAUNCH_ERROR("QuantizeStrided1d");
  if (first_tail_byte < bytes) {
    QuantizeStridedFp4Tail<<<1, 4, 0, stream>>>(a, h, first_tail_byte, bytes);
    GPUEXT_CUDA_RETURN_IF_LAUNCH_ERROR("QuantizeStridedFp4Tail");
  }
  return Status::Ok();
}

// Every run of 8 elements stays inside one row and one block: rows (K, or N for 128x128 tiles) are
// multiples of 8, every block length is (16, 32, 128, 128x128, and FP8_TENSOR's whole row), and
// the buffers are aligned for the vector loads and stores.
static bool Vectorizable(const DequantizeArgs& a) {
  const BlockScaledGeometry& g = a.geo;
  const bool rows = g.two_d() ? g.cols % kChunk == 0 : (g.inner == 1 && g.k % kChunk == 0);
  return rows && Aligned(a.data, g.fp4_packed ? 4 : 8) && Aligned(a.y, 16);
}

Status DequantizeCuda(cudaStream_t stream, const DequantizeArgs& a) {
  const int64_t n = a.geo.elements();
  if (n == 0) return Status::Ok();
  bool taken = false;
  GPUEXT_RETURN_IF_ERROR(LaunchDequantVec(stream, a, &taken));
  if (taken) return Status::Ok();
  const Hoisted h = HoistedOf(a.geo);
  if (Vectorizable(a)) {
    const int64_t chunks = n / kChunk;
    DequantizeChunks<<<unsigned(Blocks(chunks, 256)), 256, 0, stream>>>(a, h, chunks);
    GPUEXT_CUDA_RETURN_IF_LAUNCH_ERROR("DequantizeChunks");
    return Status::Ok();
  }
  Dequantize<<<unsigned(Blocks(n, 256)), 256, 0, stream>>>(a, h);
  GPUEXT_CUDA_RETURN_IF_LAUNCH_ERROR("Dequantize");
  return Status::Ok();
}

Status QuantizeTokenSlotsCuda(cudaStream_t stream, const TokenSlotsArgs& a) {
  const int64_t e = a.in_type == FloatType::kF32 ? 4 : 8;  // elements of a 16-byte piece
  if (a.m < 0 || a.cols < 0 || a.blocks < 0) return Status::Error("negative size");
  if (a.cols % e != 0)
    return Status::Error("the token-slot kernel needs cols % " + std::to_string(e) + " == 0 (16-byte row pieces), got " +
                         std::to_string(a.cols));
  if (!Aligned(a.x, 16) || !Aligned(a.data, 16) || !Aligned(a.table, 8))
    return Status::Error("the token-slot kernel needs 16-byte aligned x and codes, an 8-byte aligned table");
  if (a.blocks == 0 || a.cols == 0) return Status::Ok();
  if (a.blocks > (int64_t(1) << 31) - 1) return Status::Error("more than 2^31 - 1 slot blocks");
  vec::TokenSlotsLaunch L;
  L.x = a.x;
  L.table = a.table;
  L.data = a.data;
  L.scale = a.scale;
  L.m = a.m;
  L.cols = a.cols;
  L.slots = 128 * a.blocks;
  L.scale_rounding = a.scale_rounding;
  bool fits = true;
  WithKind(a.in_type, [&](auto kc) {
    constexpr int K = decltype(kc)::value;
    using S = vec::TokenSlotsShape<K>;
    const int64_t col_tiles = (a.cols + S::W - 1) / S::W;
    if (col_tiles > 65535) {
      fits = false;
      return;
    }
    vec::QuantizeTokenSlotsT<K><<<dim3(unsigned(a.blocks), unsigned(col_tiles), 1u), S::kThreads, 0, stream>>>(L);
  });
  if (!fits) return Status::Error("more than 65535 column tiles (cols too large for the token-slot kernel's grid)");
  GPUEXT_CUDA_RETURN_IF_LAUNCH_ERROR("QuantizeTokenSlotsT");
  return Status::Ok();
}

Status QuantizeBothAxesCuda(cudaStream_t stream, const QuantizeArgs& last, const QuantizeArgs& second, bool* fused) {
  // The fused kernel: x [outer, K, N] along K (`second`, inner == N) and along N (`last`) at once.
  const BlockScaledGeometry& g = second.geo;
  if (fused != nullptr) *fused = false;
  if (g.elements() > 0 && !g.per_tensor() && !g.two_d() && last.geo.inner == 1 && last.geo.k == g.inner) {
    bool taken = false;
    GPUEXT_RETURN_IF_ERROR(LaunchColsVec(stream, second, &last, &taken));
    if (fused != nullptr) *fused = taken;
    if (taken) return Status::Ok();
  }
  GPUEXT_RETURN_IF_ERROR(QuantizeCuda(stream, last));
  return QuantizeCuda(stream, second);
}

// ---------------------------------------------------------------------------- kernel-only timing
namespace {

int64_t InputBytes(const QuantizeArgs& a) { return a.geo.elements() * (a.in_type == FloatType::kF32 ? 4 : 2); }
int64_t DataBytes(const BlockScaledGeometry& g) { return g.fp4_packed ? (g.elements() + 1) / 2 : g.elements(); }
int64_t ScaleBytes(const BlockScaledGeometry& g) {
  const int64_t blocks = g.two_d() ? g.outer * g.blocks_along() * g.block_cols() : g.outer * g.blocks_along() * g.inner;
  return blocks * (HasF32Scale(g.format) ? 4 : 1);
}

// Device buffers of one timing run, freed whatever happens.
struct DeviceBuffers {
  std::vector<void*> ptrs;
  ~DeviceBuffers() {
    for (void* p : ptrs) cudaFree(p);
  }
  Status Alloc(int64_t bytes, void** p) {
    *p = nullptr;
    GPUEXT_CUDA_RETURN_IF_ERROR(cudaMalloc(p, size_t(std::max<int64_t>(bytes, 16))));
    ptrs.push_back(*p);
    return Status::Ok();
  }
};

struct Events {
  cudaEvent_t start = nullptr, stop = nullptr;
  ~Events() {
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
  }
};

// Seconds per call of `op` (a Status-returning launch on `stream`): two warm-up calls, then the best
// of `rounds` rounds of `reps` calls between two events.
template <class Op>
Status TimeOp(cudaStream_t stream, const Events& ev, int reps, int rounds, Op&& op, double* seconds) {
  for (int i = 0; i < 2; ++i) GPUEXT_RETURN_IF_ERROR(op());
  double best = -1;
  for (int r = 0; r < rounds; ++r) {
    GPUEXT_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev.start, stream));
    for (int i = 0; i < reps; ++i) GPUEXT_RETURN_IF_ERROR(op());
    GPUEXT_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev.stop, stream));
    GPUEXT_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(ev.stop));
    float ms = 0;
    GPUEXT_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, ev.start, ev.stop));
    const double s = double(ms) / 1e3 / reps;
    best = best < 0 ? s : std::min(best, s);
  }
  *seconds = best;
  return Status::Ok();
}

Status CopyBack(const void* dev, int64_t bytes, std::vector<uint8_t>* host) {
  host->resize(size_t(bytes));
  GPUEXT_CUDA_RETURN_IF_ERROR(cudaMemcpy(host->data(), dev, size_t(bytes), cudaMemcpyDeviceToHost));
  return Status::Ok();
}

}  // namespace

Status TimeKernelsCuda(const QuantizeArgs& args, const QuantizeArgs* last, float global_scale, int reps, int rounds,
                       KernelTimes* out) {
  if (reps < 1 || rounds < 1) return Status::Error("reps and rounds must be positive");
  if (args.x == nullptr || args.geo.elements() <= 0) return Status::Error("no input");
  if (last != nullptr && (last->geo.elements() != args.geo.elements() || last->in_type != args.in_type))
    return Status::Error("the last-axis geometry must describe the same x");
  DeviceBuffers buf;
  QuantizeArgs q = args;
  void *x, *data, *scale, *gs, *y, *dst;
  const int64_t xb = InputBytes(args), db = DataBytes(args.geo), sb = ScaleBytes(args.geo);
  GPUEXT_RETURN_IF_ERROR(buf.Alloc(xb, &x));
  GPUEXT_RETURN_IF_ERROR(buf.Alloc(db, &data));
  GPUEXT_RETURN_IF_ERROR(buf.Alloc(sb, &scale));
  GPUEXT_RETURN_IF_ERROR(buf.Alloc(4 * std::max<int64_t>(args.geo.global_count, 1), &gs));
  GPUEXT_RETURN_IF_ERROR(buf.Alloc(xb, &y));
  GPUEXT_RETURN_IF_ERROR(buf.Alloc(xb, &dst));
  GPUEXT_CUDA_RETURN_IF_ERROR(cudaMemcpy(x, args.x, size_t(xb), cudaMemcpyHostToDevice));
  std::vector<float> g(size_t(std::max<int64_t>(args.geo.global_count, 1)), global_scale);
  GPUEXT_CUDA_RETURN_IF_ERROR(cudaMemcpy(gs, g.data(), g.size() * 4, cudaMemcpyHostToDevice));
  q.x = x;
  q.data = data;
  q.scale = scale;
  q.global_scale = static_cast<const float*>(gs);
  DequantizeArgs d;
  d.geo = q.geo;
  d.out_type = q.in_type;
  d.data = data;
  d.scale = scale;
  d.global_scale = q.global_scale;
  d.y = y;
  QuantizeArgs l, s2 = q;  // quantize_both_axes: its own outputs for both axes
  if (last != nullptr) {
    l = *last;
    void *ldata, *lscale, *sdata, *sscale;
    GPUEXT_RETURN_IF_ERROR(buf.Alloc(DataBytes(l.geo), &ldata));
    GPUEXT_RETURN_IF_ERROR(buf.Alloc(ScaleBytes(l.geo), &lscale));
    GPUEXT_RETURN_IF_ERROR(buf.Alloc(db, &sdata));
    GPUEXT_RETURN_IF_ERROR(buf.Alloc(sb, &sscale));
    l.x = x;
    l.data = ldata;
    l.scale = lscale;
    l.global_scale = q.global_scale;
    s2.data = sdata;
    s2.scale = sscale;
  }
  cudaStream_t stream = nullptr;
  GPUEXT_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  struct StreamGuard {
    cudaStream_t s;
    ~StreamGuard() { cudaStreamDestroy(s); }
  } stream_guard{stream};
  Events ev;
  GPUEXT_CUDA_RETURN_IF_ERROR(cudaEventCreate(&ev.start));
  GPUEXT_CUDA_RETURN_IF_ERROR(cudaEventCreate(&ev.stop));
  GPUEXT_RETURN_IF_ERROR(TimeOp(stream, ev, reps, rounds, [&] {
    GPUEXT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, x, size_t(xb), cudaMemcpyDeviceToDevice, stream));
    return Status::Ok();
  }, &out->copy_s));
  GPUEXT_RETURN_IF_ERROR(TimeOp(stream, ev, reps, rounds, [&] { return QuantizeCuda(stream, q); }, &out->quantize_s));
  GPUEXT_RETURN_IF_ERROR(TimeOp(stream, ev, reps, rounds, [&] { return DequantizeCuda(stream, d); }, &out->dequantize_s));
  if (last != nullptr)
    GPUEXT_RETURN_IF_ERROR(
        TimeOp(stream, ev, reps, rounds, [&] { return QuantizeBothAxesCuda(stream, l, s2, &out->both_fused); },
               &out->both_s));
  GPUEXT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  GPUEXT_RETURN_IF_ERROR(CopyBack(data, db, &out->data));
  GPUEXT_RETURN_IF_ERROR(CopyBack(scale, sb, &out->scale));
  GPUEXT_RETURN_IF_ERROR(CopyBack(y, xb, &out->y));
  if (last != nullptr) {
    GPUEXT_RETURN_IF_ERROR(CopyBack(l.data, DataBytes(l.geo), &out->both_data_last));
    GPUEXT_RETURN_IF_ERROR(CopyBack(l.scale, ScaleBytes(l.geo), &out->both_scale_last));
    GPUEXT_RETURN_IF_ERROR(CopyBack(s2.data, db, &out->both_data_second));
    GPUEXT_RETURN_IF_ERROR(CopyBack(s2.scale, sb, &out->both_scale_second));
  }
  return Status::Ok();
}

}  // namespace gpuext::formats
