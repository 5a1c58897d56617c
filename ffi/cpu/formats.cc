// CPU handlers gpuext_quantize / gpuext_dequantize: decode, validate, call csrc/formats.
#include <algorithm>
#include <functional>

#include "csrc/formats/block_scaled.h"
#include "ffi/common/block_scaled_ffi.h"
#include "ffi/common/ffi_util.h"
#include "ffi/common/registry.h"

namespace gpuext::formats {
namespace {

// XLA's intra-op thread pool (the one XLA:CPU runs its own parallel loops on) as csrc's TaskRunner.
class XlaPool final : public TaskRunner {
 public:
  explicit XlaPool(ffi::ThreadPool& pool) : pool_(pool), workers_(std::max<int64_t>(1, pool.num_threads())) {}
  int64_t workers() const override { return workers_; }
  void Schedule(std::function<void()> task) const override { pool_.Schedule(std::move(task)); }

 private:
  ffi::ThreadPool& pool_;
  int64_t workers_;
};

ffi::Error QuantizeImpl(ffi::AnyBuffer x, ffi::AnyBuffer global_scale, ffi::Result<ffi::AnyBuffer> data,
                        ffi::Result<ffi::AnyBuffer> scale, int32_t format, int64_t axis, int32_t scale_rounding,
                        int32_t fp4_packed, ffi::ThreadPool pool) {
  QuantizeArgs a;
  GPUEXT_FFI_ASSIGN_OR_RETURN(a, DecodeQuantize(x, global_scale, *data, *scale, format, axis, scale_rounding, fp4_packed));
  const XlaPool runner(pool);
  GPUEXT_FFI_RETURN_IF_ERROR(QuantizeCpu(a, &runner));
  return ffi::Error::Success();
}

ffi::Error DequantizeImpl(ffi::AnyBuffer data, ffi::AnyBuffer scale, ffi::AnyBuffer global_scale,
                          ffi::Result<ffi::AnyBuffer> y, int32_t format, int64_t axis, int32_t fp4_packed, ffi::ThreadPool pool) {
  DequantizeArgs a;
  GPUEXT_FFI_ASSIGN_OR_RETURN(a, DecodeDequantize(data, scale, global_scale, *y, format, axis, fp4_packed));
  const XlaPool runner(pool);
  GPUEXT_FFI_RETURN_IF_ERROR(DequantizeCpu(a, &runner));
  return ffi::Error::Success();
}

}  // namespace
}  // namespace gpuext::formats

XLA_FFI_DEFINE_HANDLER_SYMBOL(GpuextQuantizeCpu, gpuext::formats::QuantizeImpl,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int32_t>("format")
                                  .Attr<int64_t>("axis")
                                  .Attr<int32_t>("scale_rounding")
                                  .Attr<int32_t>("fp4_packed")
                                  .Ctx<xla::ffi::ThreadPool>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(GpuextDequantizeCpu, gpuext::formats::DequantizeImpl,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int32_t>("format")
                                  .Attr<int64_t>("axis")
                                  .Attr<int32_t>("fp4_packed")
                                  .Ctx<xla::ffi::ThreadPool>());

GPUEXT_REGISTER_FFI_TARGET("gpuext_quantize", GpuextQuantizeCpu);
GPUEXT_REGISTER_FFI_TARGET("gpuext_dequantize", GpuextDequantizeCpu);
