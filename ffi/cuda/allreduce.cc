// CUDA all-reduce over NVSHMEM. Compiled into jax_gpuext._nvshmem (not _cuda): only that
// module links NVSHMEM, and Python imports it lazily (jax_gpuext/distributed.py).
//
// Two targets with one binding:
//   gpuext_all_reduce        checks the device status word after the kernels (copy + stream
//                            synchronize), so a timeout is this call's ffi::Error. Synchronizing
//                            breaks REFERENCE section 2: not command-buffer compatible.
//   gpuext_all_reduce_graph  launches kernels only; epochs and the sticky status live in device
//                            memory, the workspace is fixed at initialize, no host state changes
//                            per call: kCmdBufferCompatible. A timeout makes every later call a
//                            no-op and fails the next checked call (or distributed.check_status()).
#include <cstdint>

#include "csrc/allreduce/nvshmem_allreduce.h"
#include "ffi/common/allreduce_attrs.h"
#include "ffi/common/execute_stats.h"
#include "ffi/common/ffi_util.h"
#include "ffi/common/nvtx.h"
#include "ffi/common/registry.h"

namespace gpuext {
namespace {

using allreduce::Algorithm;
using allreduce::ReduceOp;

// rank/color/site/workspace_bytes keep the signature of the CPU target (the same lowering
// serves both platforms); NVSHMEM knows the PE and the workspace is the one allocated at
// initialize, so they are only checked here.
ffi::Error AllReduceCuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::Buffer<ffi::S32>, ffi::Buffer<ffi::S32>,
                         ffi::Result<ffi::AnyBuffer> out, int32_t op, int32_t algorithm, int64_t group_size,
                         int64_t /*site*/, int64_t /*workspace_bytes*/, float timeout_s, bool checked) {
  NvtxRange range("gpuext_all_reduce");
  if (ffi::Error e = allreduce::CheckCommon(x, out, op, timeout_s); e.failure()) return e;
  GPUEXT_FFI_CHECK(algorithm >= 1 && algorithm <= 3, "algorithm must be 1 (one_shot), 2 (two_shot) or 3 (library)");
  GPUEXT_FFI_CHECK(group_size == allreduce::NPes(),
                   "group_size " + std::to_string(group_size) + " != NVSHMEM PEs " + std::to_string(allreduce::NPes()));
  allreduce::NvshmemAllReduceArgs args;
  args.in = x.untyped_data();
  args.out = out->untyped_data();
  args.count = static_cast<int64_t>(x.element_count());
  args.dtype = *allreduce::ToDType(x.element_type());
  args.op = static_cast<ReduceOp>(op);
  args.algorithm = static_cast<Algorithm>(algorithm);
  args.timeout_s = timeout_s;
  args.checked = checked;
  GPUEXT_FFI_RETURN_IF_ERROR(allreduce::LaunchAllReduce(args, stream));
  return ffi::Error::Success();
}

#define GPUEXT_ALL_REDUCE_BINDING                       \
  ffi::Ffi::Bind()                                      \
      .Ctx<ffi::PlatformStream<cudaStream_t>>()         \
      .Arg<ffi::AnyBuffer>()                            \
      .Arg<ffi::Buffer<ffi::S32>>()                     \
      .Arg<ffi::Buffer<ffi::S32>>()                     \
      .Ret<ffi::AnyBuffer>()                            \
      .Attr<int32_t>("op")                              \
      .Attr<int32_t>("algorithm")                       \
      .Attr<int64_t>("group_size")                      \
      .Attr<int64_t>("site")                            \
      .Attr<int64_t>("workspace_bytes")                 \
      .Attr<float>("timeout_s")

ffi::Error AllReduceChecked(cudaStream_t s, ffi::AnyBuffer x, ffi::Buffer<ffi::S32> r, ffi::Buffer<ffi::S32> c,
                            ffi::Result<ffi::AnyBuffer> o, int32_t op, int32_t alg, int64_t g, int64_t site,
                            int64_t ws, float t) {
  return AllReduceCuda(s, x, r, c, o, op, alg, g, site, ws, t, /*checked=*/true);
}

ffi::Error AllReduceGraph(cudaStream_t s, ffi::AnyBuffer x, ffi::Buffer<ffi::S32> r, ffi::Buffer<ffi::S32> c,
                          ffi::Result<ffi::AnyBuffer> o, int32_t op, int32_t alg, int64_t g, int64_t site,
                          int64_t ws, float t) {
  GPUEXT_COUNT_EXECUTE("gpuext_all_reduce_graph", s);
  return AllReduceCuda(s, x, r, c, o, op, alg, g, site, ws, t, /*checked=*/false);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(AllReduceCudaFfi, AllReduceChecked, GPUEXT_ALL_REDUCE_BINDING);
XLA_FFI_DEFINE_HANDLER_SYMBOL(AllReduceCudaGraphFfi, AllReduceGraph, GPUEXT_ALL_REDUCE_BINDING,
                              {ffi::Traits::kCmdBufferCompatible});

GPUEXT_REGISTER_FFI_TARGET("gpuext_all_reduce", AllReduceCudaFfi);
GPUEXT_REGISTER_FFI_TARGET("gpuext_all_reduce_graph", AllReduceCudaGraphFfi);

}  // namespace gpuext
