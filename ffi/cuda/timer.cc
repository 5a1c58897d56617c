// CUDA handlers of the benchmarks' device timer (benchmarks/_devtime.py; docs/design.md, "Timing
// round 2"). No op of the package emits them.
//
// gpuext_timer_mark: records a CUDA event on XLA's stream into a slot of the process-wide table
// (csrc/timer/event_table.h) and hands its operands back as its results. The call must alias
// result i to operand i (input_output_aliases), so the mark copies nothing and XLA orders it by
// data: mark(x) -> op -> mark(op's results) puts the op's kernels between the two events.
// gpuext_timer_hold: keeps the stream busy for the number of microseconds in its int32 operand
// (read on the device), aliased to its result the same way.
//
// Neither declares kCmdBufferCompatible: an event recorded while XLA captures a CUDA graph would
// time the capture, not the replays, and the mark must run on every execution. XLA therefore never
// records them into a command buffer, and the mark refuses to run inside a capture all the same.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <utility>

#include "csrc/timer/event_table.h"
#include "csrc/timer/hold.h"
#include "ffi/common/execute_stats.h"
#include "ffi/common/ffi_util.h"
#include "ffi/common/registry.h"

namespace gpuext {
namespace {

// Result `i` is operand `i`'s buffer: same type, same shape, same address.
ffi::Error CheckAliased(const ffi::AnyBuffer& x, const ffi::AnyBuffer& y, size_t i) {
  const std::string which = "operand / result " + std::to_string(i) + ": ";
  GPUEXT_FFI_CHECK(x.element_type() == y.element_type() && x.dimensions() == y.dimensions(),
                   which + DataTypeName(x.element_type()) + DimsString(x.dimensions()) + " vs " +
                       DataTypeName(y.element_type()) + DimsString(y.dimensions()));
  GPUEXT_FFI_CHECK(x.untyped_data() == y.untyped_data(),
                   which + "the result is not the operand's buffer; call the target with "
                           "input_output_aliases={i: i} for every operand (it copies nothing)");
  return ffi::Error::Success();
}

ffi::Error TimerMarkImpl(cudaStream_t stream, int32_t device, ffi::RemainingArgs args, ffi::RemainingRets rets,
                         int64_t slot) {
  GPUEXT_FFI_CHECK(args.size() == rets.size(), std::to_string(args.size()) + " operands, " +
                                                   std::to_string(rets.size()) + " results");
  for (size_t i = 0; i < args.size(); ++i) {
    ffi::ErrorOr<ffi::AnyBuffer> x = args.get<ffi::AnyBuffer>(i);
    if (x.has_error()) return std::move(x).error();
    ffi::ErrorOr<ffi::Result<ffi::AnyBuffer>> y = rets.get<ffi::AnyBuffer>(i);
    if (y.has_error()) return std::move(y).error();
    if (ffi::Error e = CheckAliased(x.value(), *y.value(), i); e.failure()) return e;
  }
  GPUEXT_FFI_CHECK(!StreamIsCapturing(stream),
                   "gpuext_timer_mark ran inside a CUDA graph capture: its event would time the capture, not "
                   "the replays (compile the timed program with xla_gpu_enable_command_buffer='')");
  GPUEXT_FFI_RETURN_IF_ERROR(TimerRecord(slot, device, stream));
  return ffi::Error::Success();
}

// An int32 scalar (an alias: the handler macro would split the template's comma).
using S32Scalar = ffi::Buffer<ffi::S32, 0>;

ffi::Error TimerHoldImpl(cudaStream_t stream, S32Scalar hold_us, ffi::Result<S32Scalar> out) {
  GPUEXT_FFI_CHECK(hold_us.untyped_data() == out->untyped_data(),
                   "the result is not the operand's buffer; call the target with input_output_aliases={0: 0}");
  GPUEXT_FFI_RETURN_IF_ERROR(LaunchTimerHold(hold_us.typed_data(), stream));
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(TimerMarkFfi, TimerMarkImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attr<int64_t>("slot"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(TimerHoldFfi, TimerHoldImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<S32Scalar>()
                                  .Ret<S32Scalar>());

GPUEXT_REGISTER_FFI_TARGET("gpuext_timer_mark", TimerMarkFfi);
GPUEXT_REGISTER_FFI_TARGET("gpuext_timer_hold", TimerHoldFfi);

}  // namespace gpuext
