// CUDA handlers gpuext_quantize / gpuext_dequantize / gpuext_quantize_both_axes: decode, validate,
// launch csrc/formats kernels.
// Command-buffer compatible: the same launches every time, no allocation, no host state.
#include <cuda_runtime_api.h>

#include "csrc/formats/block_scaled_cuda.h"
#include "ffi/common/block_scaled_ffi.h"
#include "ffi/common/execute_stats.h"
#include "ffi/common/ffi_util.h"
#include "ffi/common/nvtx.h"
#include "ffi/common/registry.h"

namespace gpuext::formats {
namespace {

ffi::Error QuantizeImpl(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer global_scale, ffi::Result<ffi::AnyBuffer> data,
                        ffi::Result<ffi::AnyBuffer> scale, int32_t format, int64_t axis, int32_t scale_rounding,
                        int32_t fp4_packed) {
  NvtxRange range("gpuext_quantize");
  GPUEXT_COUNT_EXECUTE("gpuext_quantize", stream);
  QuantizeArgs a;
  GPUEXT_FFI_ASSIGN_OR_RETURN(a, DecodeQuantize(x, global_scale, *data, *scale, format, axis, scale_rounding, fp4_packed));
  GPUEXT_FFI_RETURN_IF_ERROR(QuantizeCuda(stream, a));
  return ffi::Error::Success();
}

// x quantized along axis -1 and axis -2 (1-D formats; Python sends no other): each output pair is
// decoded and checked exactly as gpuext_quantize's for that axis, then one fused launch.
ffi::Error QuantizeBothAxesImpl(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer global_scale,
                                ffi::Result<ffi::AnyBuffer> data_last, ffi::Result<ffi::AnyBuffer> scale_last,
                                ffi::Result<ffi::AnyBuffer> data_second, ffi::Result<ffi::AnyBuffer> scale_second,
                                int32_t format, int32_t scale_rounding, int32_t fp4_packed) {
  NvtxRange range("gpuext_quantize_both_axes");
  GPUEXT_COUNT_EXECUTE("gpuext_quantize_both_axes", stream);
  QuantizeArgs last, second;
  GPUEXT_FFI_ASSIGN_OR_RETURN(
      last, DecodeQuantize(x, global_scale, *data_last, *scale_last, format, -1, scale_rounding, fp4_packed));
  GPUEXT_FFI_ASSIGN_OR_RETURN(
      second, DecodeQuantize(x, global_scale, *data_second, *scale_second, format, -2, scale_rounding, fp4_packed));
  GPUEXT_FFI_RETURN_IF_ERROR(QuantizeBothAxesCuda(stream, last, second));
  return ffi::Error::Success();
}

ffi::Error DequantizeImpl(cudaStream_t stream, ffi::AnyBuffer data, ffi::AnyBuffer scale, ffi::AnyBuffer global_scale,
                          ffi::Result<ffi::AnyBuffer> y, int32_t format, int64_t axis, int32_t fp4_packed) {
  NvtxRange range("gpuext_dequantize");
  GPUEXT_COUNT_EXECUTE("gpuext_dequantize", stream);
  DequantizeArgs a;
  GPUEXT_FFI_ASSIGN_OR_RETURN(a, DecodeDequantize(data, scale, global_scale, *y, format, axis, fp4_packed));
  GPUEXT_FFI_RETURN_IF_ERROR(DequantizeCuda(stream, a));
  return ffi::Error::Success();
}

}  // namespace
}  // namespace gpuext::formats

XLA_FFI_DEFINE_HANDLER_SYMBOL(GpuextQuantizeCuda, gpuext::formats::QuantizeImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int32_t>("format")
                                  .Attr<int64_t>("axis")
                                  .Attr<int32_t>("scale_rounding")
                                  .Attr<int32_t>("fp4_packed"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(GpuextQuantizeBothAxesCuda, gpuext::formats::QuantizeBothAxesImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int32_t>("format")
                                  .Attr<int32_t>("scale_rounding")
                                  .Attr<int32_t>("fp4_packed"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(GpuextDequantizeCuda, gpuext::formats::DequantizeImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int32_t>("format")
                                  .Attr<int64_t>("axis")
                                  .Attr<int32_t>("fp4_packed"),
                              {xla::ffi::Traits::kCmdBufferCompatible});

GPUEXT_REGISTER_FFI_TARGET("gpuext_quantize", GpuextQuantizeCuda);
GPUEXT_REGISTER_FFI_TARGET("gpuext_dequantize", GpuextDequantizeCuda);
GPUEXT_REGISTER_FFI_TARGET("gpuext_quantize_both_axes", GpuextQuantizeBothAxesCuda);
