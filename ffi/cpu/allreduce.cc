// CPU all-reduce: the one-shot / two-shot protocols between XLA's host devices
// (csrc/allreduce/cpu_protocol.h). XLA's CPU runtime runs each device's computation on its
// own thread, so the calls of one group meet in the process-local heap.
#include <cstdint>
#include <exception>
#include <string>

#include "csrc/allreduce/cpu_protocol.h"
#include "ffi/common/allreduce_attrs.h"
#include "ffi/common/ffi_util.h"
#include "ffi/common/registry.h"

namespace gpuext {
namespace {

using allreduce::Algorithm;
using allreduce::ReduceOp;

// All ranks' CPU workspaces of one call site together (process memory; default 1 MiB per rank).
constexpr int64_t kMaxCpuWorkspaceBytes = int64_t{1} << 32;

// rank / color: int32 operands (lax.axis_index inside shard_map/pmap), because they differ
// per device while attributes are the same for every device of the SPMD program. Under
// vmap they arrive broadcast to the batch shape: every element holds the same value.
// run / device (XLA's RunId and device ordinal, given to CPU handlers by every jaxlib we support)
// let the protocol tell two devices that claim one rank from one device calling in a loop.
ffi::Error AllReduceCpuImpl(ffi::RunId run, int32_t device, ffi::AnyBuffer x, ffi::Buffer<ffi::S32> rank,
                            ffi::Buffer<ffi::S32> color, ffi::Result<ffi::AnyBuffer> out, int32_t op,
                            int32_t algorithm, int64_t group_size, int64_t site, int64_t workspace_bytes,
                            float timeout_s) {
  if (ffi::Error e = allreduce::CheckCommon(x, out, op, timeout_s); e.failure()) return e;
  GPUEXT_FFI_CHECK(rank.element_count() >= 1 && color.element_count() >= 1, "rank and color need a value");
  GPUEXT_FFI_CHECK(algorithm == static_cast<int32_t>(Algorithm::kOneShot) ||
                       algorithm == static_cast<int32_t>(Algorithm::kTwoShot),
                   "the CPU handler runs algorithm 1 (one_shot) or 2 (two_shot), got " + std::to_string(algorithm));
  GPUEXT_FFI_CHECK(group_size >= 1 && group_size <= 4096,
                   "group_size must be in [1, 4096], got " + std::to_string(group_size));
  // rank indexes the group's flag arrays: out of range it would read and write outside them.
  const int32_t my_rank = rank.typed_data()[0];
  GPUEXT_FFI_CHECK(my_rank >= 0 && my_rank < group_size,
                   "rank " + std::to_string(my_rank) + " is outside the group of " + std::to_string(group_size));
  // The group's heap is group_size * workspace_bytes, allocated by the first caller: bounded so
  // that an attribute cannot ask for more memory than a test machine has.
  GPUEXT_FFI_CHECK(workspace_bytes > 0 && workspace_bytes <= kMaxCpuWorkspaceBytes / group_size,
                   "workspace_bytes " + std::to_string(workspace_bytes) + " for " + std::to_string(group_size) +
                       " ranks must be positive and at most " + std::to_string(kMaxCpuWorkspaceBytes) +
                       " bytes in all");

  allreduce::CpuAllReduceArgs args;
  args.in = x.untyped_data();
  args.out = out->untyped_data();
  args.count = static_cast<int64_t>(x.element_count());
  args.dtype = *allreduce::ToDType(x.element_type());
  args.op = static_cast<ReduceOp>(op);
  args.algorithm = static_cast<Algorithm>(algorithm);
  args.rank = my_rank;
  args.group_size = static_cast<int>(group_size);
  args.site = site;
  args.color = color.typed_data()[0];
  args.workspace_bytes = workspace_bytes;
  args.timeout_s = timeout_s;
  args.run_id = run.run_id;
  args.device = device;
  GPUEXT_FFI_CHECK(allreduce::ChunkElements(args.algorithm, args.group_size, workspace_bytes,
                                            allreduce::ByteWidth(args.dtype)) > 0,
                   "workspace_bytes " + std::to_string(workspace_bytes) + " cannot hold one element per rank");
  try {  // an exception must not unwind through XLA's C API (std::terminate): allocation failures
    GPUEXT_FFI_RETURN_IF_ERROR(allreduce::CpuAllReduce(args));
  } catch (const std::exception& e) {
    return ffi::Error(ffi::ErrorCode::kResourceExhausted, std::string("all_reduce: ") + e.what());
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(AllReduceCpuFfi, AllReduceCpuImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::RunId>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int32_t>("op")
                                  .Attr<int32_t>("algorithm")
                                  .Attr<int64_t>("group_size")
                                  .Attr<int64_t>("site")
                                  .Attr<int64_t>("workspace_bytes")
                                  .Attr<float>("timeout_s"));

GPUEXT_REGISTER_FFI_TARGET("gpuext_all_reduce", AllReduceCpuFfi);

}  // namespace gpuext
