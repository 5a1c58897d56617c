// One-shot and two-shot all-reduce over NVSHMEM symmetric memory, plus the NVSHMEM library
// collective as a baseline. Protocol (the CPU twin is csrc/allreduce/cpu_protocol.cc):
//   every chunk is one epoch e (Control::epoch + 1, bumped on the device by the last block);
//   a writer may fill its slot in PE p only once p has signalled consumed[me] >= e-1;
//   data travel with put-with-signal (posted / gathered := e), readers spin on local flags;
//   after reading, this PE signals consumed := e to every writer.
// Every spin has a %globaltimer deadline. A block that misses it sets the sticky status word
// (and the bits of the PEs it did not see) and returns; later launches see the status and
// return at once, so nothing ever hangs. The host turns the word into an error (CheckStatus).
#include <nvshmem.h>
#include <nvshmemx.h>

#include <algorithm>
#include <string>

#include "csrc/allreduce/nvshmem_allreduce.h"
#include "csrc/allreduce/nvshmem_state.cuh"
#include "csrc/common/cuda_check.h"

namespace gpuext::allreduce {
namespace {

constexpr int kThreads = 512;

__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ uint32_t LoadStatus(Control* ctl) {
  return *reinterpret_cast<volatile uint32_t*>(&ctl->status);
}

// Bit s for every PE s in [first, last) whose flags[s] is still below target.
__device__ unsigned long long Missing(uint64_t* flags, int first, int last, uint64_t target) {
  unsigned long long missing = 0;
  for (int s = first; s < last; ++s)
    if (nvshmem_signal_fetch(&flags[s]) < target) missing |= 1ull << s;
  return missing;
}

__device__ void RecordMissing(Control* ctl, unsigned long long missing) {
  atomicOr(&ctl->missing, missing);
  atomicOr(&ctl->status, kPeersMissing);
}

// Thread 0 only: waits until flags[s] >= target for s in [first, last). On timeout records the
// missing PEs in the sticky status word and returns false.
__device__ bool WaitFlags(Control* ctl, uint64_t* flags, int first, int last, uint64_t target,
                          uint64_t deadline) {
  for (;;) {
    const unsigned long long missing = Missing(flags, first, last, target);
    if (missing == 0) {
      __threadfence();  // the data that came with the signals is visible after this
      return true;
    }
    if (LoadStatus(ctl) != 0) return false;  // another block already gave up
    if (GlobalTimerNs() > deadline) {
      RecordMissing(ctl, missing);
      return false;
    }
  }
}

// Whole block: thread 0 waits, everyone learns the verdict.
__device__ bool BlockWait(Control* ctl, uint64_t* flags, int first, int last, uint64_t target, uint64_t deadline) {
  __shared__ int ok;
  if (threadIdx.x == 0) ok = WaitFlags(ctl, flags, first, last, target, deadline);
  __syncthreads();
  return ok;
}

// Grid-wide step: all blocks of this (small, co-resident) grid passed `counter`. The blocks
// it waits for were still waiting for the PEs whose `posted` (epoch e) is missing; with none
// missing, they never ran: a timeout records whichever it was.
__device__ bool GridArrive(Control* ctl, uint32_t* counter, int n, uint64_t e, uint64_t deadline) {
  __shared__ int ok;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(counter, 1u);
    ok = 1;
    while (*reinterpret_cast<volatile uint32_t*>(counter) < gridDim.x) {
      if (LoadStatus(ctl) != 0) {  // another block already gave up
        ok = 0;
        break;
      }
      if (GlobalTimerNs() > deadline) {
        const unsigned long long missing = Missing(ctl->posted, 0, n, e);
        if (missing != 0) RecordMissing(ctl, missing);
        else atomicOr(&ctl->status, kGridStalled);
        ok = 0;
        break;
      }
    }
    __threadfence();
  }
  __syncthreads();
  return ok;
}

// The last block to finish: free the writers' slots and publish the epoch.
__device__ void FinishEpoch(Control* ctl, uint32_t* counter, int n, uint64_t e) {
  __shared__ int last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(counter, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last || threadIdx.x != 0) return;
  // Acquire: the other blocks' slot reads (released by their fence + atomicAdd) happen before
  // the consumed signal lets a peer overwrite those slots.
  __threadfence();
  const int me = nvshmem_my_pe();
  ctl->arrived[0] = ctl->arrived[1] = 0;
  for (int p = 0; p < n; ++p) nvshmemx_signal_op(&ctl->consumed[me], e, NVSHMEM_SIGNAL_SET, p);
  *reinterpret_cast<volatile uint64_t*>(&ctl->epoch) = e;
}

template <typename S>
__device__ __forceinline__ S LoadVolatile(const S* p) {  // bypass L1: peers wrote it
  return *reinterpret_cast<const volatile S*>(p);
}

template <DType T, ReduceOp Op>
__device__ void ReduceSlots(typename Elem<T>::Storage* out, const typename Elem<T>::Storage* slots,
                            int64_t slot_stride, int n, int64_t len) {
  using E = Elem<T>;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < len; i += int64_t{gridDim.x} * blockDim.x) {
    auto acc = E::Load(LoadVolatile(slots + i));
    for (int s = 1; s < n; ++s) acc = Combine<Op>(acc, E::Load(LoadVolatile(slots + s * slot_stride + i)));
    out[i] = E::Store(acc);
  }
}

struct KernelArgs {
  const void* in;
  void* out;
  int64_t len;   // elements in this chunk
  int64_t slot;  // elements per slot (one_shot) or per segment (two_shot)
  Control* ctl;
  void* data;
  int me, n;
  uint64_t timeout_ns;
};

template <DType T, ReduceOp Op>
__global__ void __launch_bounds__(kThreads) OneShotKernel(KernelArgs a) {
  using S = typename Elem<T>::Storage;
  if (LoadStatus(a.ctl) != 0) return;
  const uint64_t e = *reinterpret_cast<volatile uint64_t*>(&a.ctl->epoch) + 1;
  const uint64_t deadline = GlobalTimerNs() + a.timeout_ns;
  S* data = static_cast<S*>(a.data);
  if (blockIdx.x < a.n) {  // block p pushes my chunk into slot `me` of PE p
    const int p = blockIdx.x;
    if (!BlockWait(a.ctl, a.ctl->consumed, p, p + 1, e - 1, deadline)) return;
    nvshmemx_putmem_signal_block(data + a.me * a.slot, a.in, a.len * sizeof(S), &a.ctl->posted[a.me], e,
                                 NVSHMEM_SIGNAL_SET, p);
  }
  if (!BlockWait(a.ctl, a.ctl->posted, 0, a.n, e, deadline)) return;
  ReduceSlots<T, Op>(static_cast<S*>(a.out), data, a.slot, a.n, a.len);
  FinishEpoch(a.ctl, &a.ctl->arrived[1], a.n, e);
}

template <DType T, ReduceOp Op>
__global__ void __launch_bounds__(kThreads) TwoShotKernel(KernelArgs a) {
  using S = typename Elem<T>::Storage;
  if (LoadStatus(a.ctl) != 0) return;
  const uint64_t e = *reinterpret_cast<volatile uint64_t*>(&a.ctl->epoch) + 1;
  const uint64_t deadline = GlobalTimerNs() + a.timeout_ns;
  S* data = static_cast<S*>(a.data);  // [n reduce-scatter segments][n all-gather segments]
  const S* in = static_cast<const S*>(a.in);
  S* out = static_cast<S*>(a.out);
  auto seg_len = [&](int p) { return max(int64_t{0}, min(a.slot, a.len - p * a.slot)); };
  if (blockIdx.x < a.n) {  // reduce-scatter: segment p of my chunk goes to PE p
    const int p = blockIdx.x;
    if (!BlockWait(a.ctl, a.ctl->consumed, p, p + 1, e - 1, deadline)) return;
    nvshmemx_putmem_signal_block(data + a.me * a.slot, in + p * a.slot, seg_len(p) * sizeof(S),
                                 &a.ctl->posted[a.me], e, NVSHMEM_SIGNAL_SET, p);
  }
  if (!BlockWait(a.ctl, a.ctl->posted, 0, a.n, e, deadline)) return;
  ReduceSlots<T, Op>(out + a.me * a.slot, data, a.slot, a.n, seg_len(a.me));
  if (!GridArrive(a.ctl, &a.ctl->arrived[0], a.n, e, deadline)) return;  // my segment is complete
  if (blockIdx.x < a.n) {  // all-gather: my reduced segment goes to slot n+me of PE p
    const int p = blockIdx.x;
    nvshmemx_putmem_signal_block(data + (a.n + a.me) * a.slot, out + a.me * a.slot, seg_len(a.me) * sizeof(S),
                                 &a.ctl->gathered[a.me], e, NVSHMEM_SIGNAL_SET, p);
  }
  if (!BlockWait(a.ctl, a.ctl->gathered, 0, a.n, e, deadline)) return;
  const int64_t total = int64_t{a.n} * a.slot;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int s = static_cast<int>(i / a.slot);
    const int64_t j = i - s * a.slot;
    if (s != a.me && j < seg_len(s)) out[s * a.slot + j] = LoadVolatile(data + (a.n + s) * a.slot + j);
  }
  FinishEpoch(a.ctl, &a.ctl->arrived[1], a.n, e);
}

std::string MissingList(unsigned long long mask) {
  std::string s = "[";
  for (int p = 0; p < kMaxPes; ++p)
    if (mask >> p & 1) s += (s.size() > 1 ? ", " : "") + std::to_string(p);
  return s + "]";
}

template <DType T, ReduceOp Op>
Status LaunchKernels(const NvshmemAllReduceArgs& args, Workspace& ws, cudaStream_t stream) {
  using S = typename Elem<T>::Storage;
  const int n = ws.n_pes;
  const bool two = args.algorithm == Algorithm::kTwoShot;
  // one_shot: n slots of one chunk; two_shot: 2n segments, chunk = n segments.
  const int64_t slot = ws.data_bytes / (int64_t{two ? 2 : 1} * n * sizeof(S));
  const int64_t chunk = two ? slot * n : slot;
  if (slot <= 0) return Status::Error("NVSHMEM workspace too small for one element per PE");
  KernelArgs k{nullptr, nullptr, 0, slot, ws.ctl, ws.data, ws.my_pe, n,
               static_cast<uint64_t>(args.timeout_s * 1e9)};
  for (int64_t off = 0; off < args.count; off += chunk) {
    k.in = static_cast<const S*>(args.in) + off;
    k.out = static_cast<S*>(args.out) + off;
    k.len = std::min(chunk, args.count - off);
    // At least one block per peer (each pushes to one PE); more blocks for the reduction.
    const int64_t want = (k.len + int64_t{kThreads} * 8 - 1) / (int64_t{kThreads} * 8);
    const int blocks = static_cast<int>(std::clamp<int64_t>(want, n, 4 * n));
    if (two) TwoShotKernel<T, Op><<<blocks, kThreads, 0, stream>>>(k);
    else OneShotKernel<T, Op><<<blocks, kThreads, 0, stream>>>(k);
    GPUEXT_CUDA_RETURN_IF_LAUNCH_ERROR("all_reduce kernel");
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------- library
// nvshmemx_<type>_<op>_reduce_on_stream over TEAM_WORLD; source and dest must be symmetric,
// so chunks are staged through the workspace's library region (first half in, second half out).
#define GPUEXT_NVSHMEM_ARITH(NAME, TYPE)                                                          \
  case ReduceOp::kSum: return nvshmemx_##NAME##_sum_reduce_on_stream(NVSHMEM_TEAM_WORLD, (TYPE*)d, (const TYPE*)s, n, st); \
  case ReduceOp::kMax: return nvshmemx_##NAME##_max_reduce_on_stream(NVSHMEM_TEAM_WORLD, (TYPE*)d, (const TYPE*)s, n, st); \
  case ReduceOp::kMin: return nvshmemx_##NAME##_min_reduce_on_stream(NVSHMEM_TEAM_WORLD, (TYPE*)d, (const TYPE*)s, n, st); \
  case ReduceOp::kProd: return nvshmemx_##NAME##_prod_reduce_on_stream(NVSHMEM_TEAM_WORLD, (TYPE*)d, (const TYPE*)s, n, st);
#define GPUEXT_NVSHMEM_BITWISE(NAME, TYPE)                                                        \
  case ReduceOp::kAnd: return nvshmemx_##NAME##_and_reduce_on_stream(NVSHMEM_TEAM_WORLD, (TYPE*)d, (const TYPE*)s, n, st); \
  case ReduceOp::kOr: return nvshmemx_##NAME##_or_reduce_on_stream(NVSHMEM_TEAM_WORLD, (TYPE*)d, (const TYPE*)s, n, st);

int LibraryReduce(DType t, ReduceOp op, void* d, const void* s, size_t n, cudaStream_t st) {
  switch (t) {
    case DType::kF32: switch (op) { GPUEXT_NVSHMEM_ARITH(float, float) default: break; } break;
    case DType::kF64: switch (op) { GPUEXT_NVSHMEM_ARITH(double, double) default: break; } break;
    case DType::kF16: switch (op) { GPUEXT_NVSHMEM_ARITH(half, half) default: break; } break;
    case DType::kBF16: switch (op) { GPUEXT_NVSHMEM_ARITH(bfloat16, __nv_bfloat16) default: break; } break;
    case DType::kS8: switch (op) { GPUEXT_NVSHMEM_ARITH(int8, int8_t) GPUEXT_NVSHMEM_BITWISE(int8, int8_t) } break;
    case DType::kU8: switch (op) { GPUEXT_NVSHMEM_ARITH(uint8, uint8_t) GPUEXT_NVSHMEM_BITWISE(uint8, uint8_t) } break;
    case DType::kS32: switch (op) { GPUEXT_NVSHMEM_ARITH(int32, int32_t) GPUEXT_NVSHMEM_BITWISE(int32, int32_t) } break;
    case DType::kU32: switch (op) { GPUEXT_NVSHMEM_ARITH(uint32, uint32_t) GPUEXT_NVSHMEM_BITWISE(uint32, uint32_t) } break;
    case DType::kS64: switch (op) { GPUEXT_NVSHMEM_ARITH(int64, int64_t) GPUEXT_NVSHMEM_BITWISE(int64, int64_t) } break;
    case DType::kU64: switch (op) { GPUEXT_NVSHMEM_ARITH(uint64, uint64_t) GPUEXT_NVSHMEM_BITWISE(uint64, uint64_t) } break;
    default: break;
  }
  return -1;
}
#undef GPUEXT_NVSHMEM_ARITH
#undef GPUEXT_NVSHMEM_BITWISE

Status LaunchLibrary(const NvshmemAllReduceArgs& args, Workspace& ws, cudaStream_t stream) {
  const int w = ByteWidth(args.dtype);
  const int64_t chunk = ws.data_bytes / 2 / w;
  unsigned char* src = ws.library;
  unsigned char* dst = ws.library + chunk * w;
  for (int64_t off = 0; off < args.count; off += chunk) {
    const int64_t len = std::min(chunk, args.count - off);
    GPUEXT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(src, static_cast<const unsigned char*>(args.in) + off * w, len * w,
                                                cudaMemcpyDeviceToDevice, stream));
    if (int rc = LibraryReduce(args.dtype, args.op, dst, src, static_cast<size_t>(len), stream); rc != 0)
      return Status::Error("nvshmemx reduce_on_stream returned " + std::to_string(rc) + " for op " + OpName(args.op));
    GPUEXT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(static_cast<unsigned char*>(args.out) + off * w, dst, len * w,
                                                cudaMemcpyDeviceToDevice, stream));
  }
  return Status::Ok();
}

}  // namespace

Status CheckStatus(cudaStream_t stream) {
  Workspace& ws = GlobalWorkspace();
  if (ws.ctl == nullptr) return Status::Error("NVSHMEM workspace not allocated (jax_gpuext.distributed.initialize)");
  // XLA's streams do not synchronize with the legacy default stream: without a device-wide
  // wait, an all_reduce still in flight could leave the word we read stale.
  if (stream == nullptr) GPUEXT_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  GPUEXT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(ws.host_ctl, ws.ctl, sizeof(Control), cudaMemcpyDeviceToHost, stream));
  GPUEXT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  const Control& c = *ws.host_ctl;
  if (c.status == 0) return Status::Ok();
  std::string why;
  if (c.status & kPeersMissing)
    why = "PEs " + MissingList(c.missing) + " of " + std::to_string(ws.n_pes) + " did not arrive";
  if (c.status & kGridStalled)
    why += std::string(why.empty() ? "" : "; ") +
           "every PE arrived, but not all blocks of this PE's two_shot kernel reached its grid-wide step: they "
           "must run at the same time (too few SMs for this process, e.g. a small CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, "
           "or other kernels occupying the GPU)";
  return Status::Error("all_reduce timed out: " + why + " (this is PE " + std::to_string(ws.my_pe) + ", epoch " +
                       std::to_string(c.epoch + 1) +
                       "). The NVSHMEM all-reduce state stays failed: restart the processes.");
}

Status LaunchAllReduce(const NvshmemAllReduceArgs& args, cudaStream_t stream) {
  Workspace& ws = GlobalWorkspace();
  if (ws.ctl == nullptr) return Status::Error("NVSHMEM workspace not allocated (jax_gpuext.distributed.initialize)");
  if (args.count == 0) return Status::Ok();
  if (args.algorithm == Algorithm::kLibrary) {
    GPUEXT_RETURN_IF_ERROR(LaunchLibrary(args, ws, stream));
    return Status::Ok();  // the library has no timeout: it is a baseline only
  }
  Status launched = Status::Error("unsupported dtype/op");
  VisitDType(args.dtype, [&](auto dtag) {
    VisitOp(args.op, [&](auto otag) {
      constexpr DType T = decltype(dtag)::value;
      constexpr ReduceOp Op = decltype(otag)::value;
      // Only the pairs Python allows: bool with and/or/max/min, numbers with sum/max/min/prod.
      constexpr bool logical = Op == ReduceOp::kAnd || Op == ReduceOp::kOr;
      constexpr bool ordered = Op == ReduceOp::kMax || Op == ReduceOp::kMin;
      if constexpr ((T == DType::kPred) ? (logical || ordered) : !logical)
        launched = LaunchKernels<T, Op>(args, ws, stream);
    });
  });
  GPUEXT_RETURN_IF_ERROR(launched);
  if (args.checked) GPUEXT_RETURN_IF_ERROR(CheckStatus(stream));
  return Status::Ok();
}

}  // namespace gpuext::allreduce
