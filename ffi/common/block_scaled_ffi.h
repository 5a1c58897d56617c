// Decoding shared by the CPU and CUDA handlers of gpuext_quantize / gpuext_dequantize:
// attributes and buffer shapes -> csrc/formats argument structs, with named errors.
#pragma once

#include <string>
#include <vector>

#include "csrc/formats/block_scaled.h"
#include "ffi/common/ffi_util.h"

namespace gpuext::formats {

inline ffi::ErrorOr<FloatType> FloatTypeOf(ffi::DataType t, const char* what) {
  switch (t) {
    case ffi::DataType::F32: return FloatType::kF32;
    case ffi::DataType::BF16: return FloatType::kBF16;
    case ffi::DataType::F16: return FloatType::kF16;
    default:
      return ffi::Unexpected<ffi::Error>(ffi::Error(
          ffi::ErrorCode::kInvalidArgument,
          std::string(what) + " must be float32, bfloat16 or float16, got " + DataTypeName(t)));
  }
}

inline ffi::DataType ElementTypeOf(int32_t format) {
  if (format == kMxfp8E5m2) return ffi::DataType::F8E5M2;
  return IsFp4(format) ? ffi::DataType::F4E2M1FN : ffi::DataType::F8E4M3FN;
}

inline ffi::DataType ScaleTypeOf(int32_t format) {
  if (IsMx(format)) return ffi::DataType::F8E8M0FNU;
  return format == kNvfp4 ? ffi::DataType::F8E4M3FN : ffi::DataType::F32;
}

// Geometry of `dims` (the shape of the float array, named `dims_name`) quantized along `axis`
// (negative) in `format`; checks the element buffer (dtype, shape; FP4 packing is the
// fp4_packed attribute), the scale buffer and the global scale.
inline ffi::ErrorOr<BlockScaledGeometry> GeometryOf(int32_t format, int64_t axis, ffi::Span<const int64_t> dims,
                                                    const char* dims_name, const ffi::AnyBuffer& data,
                                                    const ffi::AnyBuffer& scale, const ffi::AnyBuffer& global_scale,
                                                    int32_t fp4_packed) {
  auto fail = [](std::string m) {
    return ffi::Unexpected<ffi::Error>(ffi::Error(ffi::ErrorCode::kInvalidArgument, std::move(m)));
  };
  if (format < kMxfp8E4m3 || format > kLastFormat) return fail("unknown format " + std::to_string(format));
  // Both platforms take every index from `dims` alone: a data buffer of another shape would be
  // read or written out of bounds. XLA gives FP4 buffers the logical shape too (packed or not).
  if (!(data.dimensions() == dims))
    return fail("element buffer has shape " + DimsString(data.dimensions()) + " but " + dims_name + " has shape " +
                DimsString(dims));
  BlockScaledGeometry g;
  g.format = format;
  const int64_t rank = int64_t(dims.size());
  if (axis >= 0 || axis < -rank) return fail("axis " + std::to_string(axis) + " must be negative and within rank");
  const int64_t ax = rank + axis;
  int64_t outer = 1;
  // The scale buffer's full shape (jax_gpuext.formats.scale_shape), and how many leading dims of
  // `dims` the per-tensor values (FP8_TENSOR's scale, the global scale) may span. Every dim is
  // compared, not only the element count: a permuted scale shape holds as many entries, and the
  // kernels would read its blocks in the wrong order (issue 26).
  std::vector<int64_t> scale_dims(dims.begin(), dims.end());
  int64_t outer_rank = 0;
  if (g.per_tensor()) {
    // The scale's dimensions are the leading (vmap batch) dimensions: one tensor each.
    outer_rank = int64_t(scale.dimensions().size());
    if (outer_rank > rank) return fail("FP8_TENSOR scale has more dimensions than the data");
    scale_dims.resize(outer_rank);
    g.k = 1;
    for (int64_t d = outer_rank; d < rank; ++d) g.k *= dims[d];
    g.block = g.k > 0 ? g.k : 1;
  } else if (g.two_d()) {
    if (rank < 2 || axis != -1) return fail("FP8_128x128 needs rank >= 2 and axis -1");
    outer_rank = rank - 2;
    g.k = dims[rank - 2];
    g.cols = dims[rank - 1];
    scale_dims[rank - 2] = (g.k + 127) / 128;
    scale_dims[rank - 1] = (g.cols + 127) / 128;
  } else {
    outer_rank = ax;
    g.k = dims[ax];
    g.inner = 1;
    for (int64_t d = ax + 1; d < rank; ++d) g.inner *= dims[d];
    g.block = format == kNvfp4 ? 16 : (format == kFp8Blockwise1x128 ? 128 : 32);
    scale_dims[ax] = (g.k + g.block - 1) / g.block;
  }
  for (int64_t d = 0; d < outer_rank; ++d) outer *= dims[d];
  g.outer = outer;
  if (data.element_type() != ElementTypeOf(format))
    return fail(std::string("element buffer has dtype ") + DataTypeName(data.element_type()) + ", expected " +
                DataTypeName(ElementTypeOf(format)));
  if (scale.element_type() != ScaleTypeOf(format))
    return fail(std::string("scale buffer has dtype ") + DataTypeName(scale.element_type()) + ", expected " +
                DataTypeName(ScaleTypeOf(format)));
  // Python passes the platform's FP4 layout (jax_gpuext/formats.py FP4_PACKED). The attribute is
  // checked against the buffer XLA allocated rather than trusted: float4_e2m1fn is packed by the
  // XLA that runs (PackedByteSize), so fp4_packed=0 would write one byte per element past its end.
  if (fp4_packed != 0 && fp4_packed != 1) return fail("fp4_packed must be 0 or 1, got " + std::to_string(fp4_packed));
  g.fp4_packed = IsFp4(format) && fp4_packed == 1;
  const int64_t n = g.elements();
  const int64_t data_bytes = g.fp4_packed ? (n + 1) / 2 : n;  // what csrc/formats reads or writes
  if (ffi::Error e = CheckHolds(data, "element buffer", data_bytes); e.failure())
    return ffi::Unexpected<ffi::Error>(std::move(e));
  const int64_t blocks = g.two_d() ? outer * g.blocks_along() * g.block_cols() : outer * g.blocks_along() * g.inner;
  if (!(scale.dimensions() == ffi::Span<const int64_t>(scale_dims.data(), scale_dims.size())) ||
      ElementCount(scale.dimensions()) != blocks)
    return fail("scale buffer has shape " + DimsString(scale.dimensions()) + ", expected " +
                DimsString(ffi::Span<const int64_t>(scale_dims.data(), scale_dims.size())) + " for " + dims_name +
                " " + DimsString(dims) + " (axis " + std::to_string(axis) + ")");
  if (ffi::Error e = CheckHolds(scale, "scale buffer", blocks * PackedByteSize(scale.element_type(), 1));
      e.failure())
    return ffi::Unexpected<ffi::Error>(std::move(e));
  if (global_scale.element_type() != ffi::DataType::F32) return fail("global scale must be float32");
  // One value per index of the leading dims it spans (a scalar, or vmap's batch dims): the kernels
  // give row r the value r / (outer / count), which is that index only when its dims are a prefix.
  const auto gd = global_scale.dimensions();
  bool prefix = int64_t(gd.size()) <= outer_rank;
  for (size_t d = 0; prefix && d < gd.size(); ++d) prefix = gd[d] == dims[d];
  g.global_count = ElementCount(gd);
  if (!prefix || g.global_count <= 0 || outer % g.global_count != 0)
    return fail("global scale has shape " + DimsString(gd) + ": it must be a scalar or the leading dims of " +
                dims_name + " " + DimsString(dims) + " before the blocked axes (at most " +
                std::to_string(outer_rank) + " of them)");
  return g;
}

// The operands and attributes of gpuext_quantize as csrc/formats arguments. Shared by the CPU
// and CUDA handlers, which differ only in the function they hand the arguments to.
inline ffi::ErrorOr<QuantizeArgs> DecodeQuantize(ffi::AnyBuffer x, ffi::AnyBuffer global_scale,
                                                 ffi::AnyBuffer data, ffi::AnyBuffer scale, int32_t format,
                                                 int64_t axis, int32_t scale_rounding, int32_t fp4_packed) {
  QuantizeArgs a;
  GPUEXT_FFI_ASSIGN_OR_FORWARD(a.in_type, FloatTypeOf(x.element_type(), "x"));
  GPUEXT_FFI_ASSIGN_OR_FORWARD(
      a.geo, GeometryOf(format, axis, x.dimensions(), "x", data, scale, global_scale, fp4_packed));
  if (!(scale_rounding == kRoundUp || (scale_rounding == kRoundOcp && IsMx(format)) ||
        (scale_rounding == kRoundNearest && format == kNvfp4)))
    return ffi::Unexpected<ffi::Error>(ffi::Error(
        ffi::ErrorCode::kInvalidArgument, "scale_rounding " + std::to_string(scale_rounding) +
                                              " is not valid for format " + std::to_string(format)));
  a.scale_rounding = scale_rounding;
  if (ffi::Error e = CheckHolds(x, "x", PackedByteSize(x.element_type(), a.geo.elements())); e.failure())
    return ffi::Unexpected<ffi::Error>(std::move(e));
  a.x = x.untyped_data();
  a.global_scale = static_cast<const float*>(global_scale.untyped_data());
  a.data = data.untyped_data();
  a.scale = scale.untyped_data();
  return a;
}

// The operands and attributes of gpuext_dequantize as csrc/formats arguments (both platforms).
inline ffi::ErrorOr<DequantizeArgs> DecodeDequantize(ffi::AnyBuffer data, ffi::AnyBuffer scale,
                                                     ffi::AnyBuffer global_scale, ffi::AnyBuffer y,
                                                     int32_t format, int64_t axis, int32_t fp4_packed) {
  DequantizeArgs a;
  GPUEXT_FFI_ASSIGN_OR_FORWARD(a.out_type, FloatTypeOf(y.element_type(), "output"));
  GPUEXT_FFI_ASSIGN_OR_FORWARD(
      a.geo, GeometryOf(format, axis, y.dimensions(), "output", data, scale, global_scale, fp4_packed));
  if (ffi::Error e = CheckHolds(y, "output", PackedByteSize(y.element_type(), a.geo.elements())); e.failure())
    return ffi::Unexpected<ffi::Error>(std::move(e));
  a.data = data.untyped_data();
  a.scale = scale.untyped_data();
  a.global_scale = static_cast<const float*>(global_scale.untyped_data());
  a.y = y.untyped_data();
  return a;
}

}  // namespace gpuext::formats
