// CPU quantize / dequantize: plain loops over blocks, the rules from block_scaled_math.h.
// Exact under XLA's FTZ/DAZ MXCSR: no float arithmetic ever sees a subnormal.
#include <string>

#include "csrc/formats/block_scaled.h"
#include "csrc/formats/block_scaled_io.h"

namespace gpuext::formats {
namespace {

uint32_t GlobalScaleBits(const BlockScaledGeometry& g, const float* gs, int64_t outer_index) {
  return FloatToBits(gs[outer_index / (g.outer / g.global_count)]);
}

// Calls visit(element_index) for every element of block (o, b, i) of a 1-D format.
template <typename Visit>
void ForBlock1d(const BlockScaledGeometry& g, int64_t o, int64_t b, int64_t i, Visit visit) {
  const int64_t end = (b + 1) * g.block < g.k ? (b + 1) * g.block : g.k;
  for (int64_t kk = b * g.block; kk < end; ++kk) visit((o * g.k + kk) * g.inner + i);
}

template <typename Visit>
void ForTile(const BlockScaledGeometry& g, int64_t o, int64_t br, int64_t bc, Visit visit) {
  const int64_t rend = (br + 1) * 128 < g.k ? (br + 1) * 128 : g.k;
  const int64_t cend = (bc + 1) * 128 < g.cols ? (bc + 1) * 128 : g.cols;
  for (int64_t r = br * 128; r < rend; ++r)
    for (int64_t c = bc * 128; c < cend; ++c) visit((o * g.k + r) * g.cols + c);
}

template <typename ForEachBlock>
void QuantizeBlocks(const QuantizeArgs& a, ForEachBlock for_each_block) {
  for_each_block([&](int64_t o, int64_t scale_index, auto for_elements) {
    uint32_t amax = 0;
    for_elements([&](int64_t e) {
      const uint32_t v = LoadInputBits(a.x, a.in_type, e) & kF32AbsMask;
      amax = v > amax ? v : amax;
    });
    const uint32_t gbits = a.global_scale ? GlobalScaleBits(a.geo, a.global_scale, o) : kF32One;
    const BlockScale s = ComputeBlockScale(a.geo.format, a.scale_rounding, amax, gbits);
    StoreScale(a.scale, a.geo.format, scale_index, s.stored);
    for_elements([&](int64_t e) {
      StoreElementCodeSequential(a.data, a.geo.fp4_packed, e,
                                 QuantizeElement(a.geo.format, s, LoadInputBits(a.x, a.in_type, e)));
    });
  });
}

}  // namespace

Status QuantizeCpu(const QuantizeArgs& a) {
  const BlockScaledGeometry& g = a.geo;
  if (g.global_count <= 0 || g.outer % g.global_count != 0)
    return Status::Error("global scale count " + std::to_string(g.global_count) + " does not divide " +
                         std::to_string(g.outer) + " leading rows");
  if (g.two_d()) {
    QuantizeBlocks(a, [&](auto body) {
      for (int64_t o = 0; o < g.outer; ++o)
        for (int64_t br = 0; br < g.blocks_along(); ++br)
          for (int64_t bc = 0; bc < g.block_cols(); ++bc)
            body(o, (o * g.blocks_along() + br) * g.block_cols() + bc,
                 [&](auto visit) { ForTile(g, o, br, bc, visit); });
    });
  } else {
    QuantizeBlocks(a, [&](auto body) {
      for (int64_t o = 0; o < g.outer; ++o)
        for (int64_t b = 0; b < g.blocks_along(); ++b)
          for (int64_t i = 0; i < g.inner; ++i)
            body(o, (o * g.blocks_along() + b) * g.inner + i,
                 [&](auto visit) { ForBlock1d(g, o, b, i, visit); });
    });
  }
  return Status::Ok();
}

Status DequantizeCpu(const DequantizeArgs& a) {
  const BlockScaledGeometry& g = a.geo;
  if (g.global_count <= 0 || g.outer % g.global_count != 0)
    return Status::Error("global scale count does not divide the leading rows");
  const BitFormat& out = OutputFormat(a.out_type);
  const int64_t rows_per_g = g.outer / g.global_count;
  const int64_t row_len = g.two_d() ? g.k * g.cols : g.k * g.inner;
  for (int64_t e = 0; e < g.elements(); ++e) {
    const int64_t o = e / row_len, rest = e % row_len;
    int64_t s;
    if (g.two_d()) {
      const int64_t r = rest / g.cols, c = rest % g.cols;
      s = (o * g.blocks_along() + r / 128) * g.block_cols() + c / 128;
    } else {
      const int64_t kk = rest / g.inner, i = rest % g.inner;
      s = (o * g.blocks_along() + kk / g.block) * g.inner + i;
    }
    const uint32_t gbits = a.global_scale ? FloatToBits(a.global_scale[o / rows_per_g]) : kF32One;
    const uint32_t bits = DequantizeElement(g.format, LoadElementCode(a.data, g.fp4_packed, e),
                                            LoadScale(a.scale, g.format, s), gbits, out);
    StoreOutput(a.y, a.out_type, e, bits);
  }
  return Status::Ok();
}

}  // namespace gpuext::formats
