// How often each command-buffer-compatible CUDA handler's execute stage ran, and how many of those
// runs happened while its stream was being captured into a CUDA graph (docs/design.md, "Checking
// command-buffer capture"). XLA records a captured custom call by running the handler on a
// capturing stream, and a replayed graph never calls it again; so these two numbers show whether
// a call was captured and replayed on every jaxlib, without reading XLA's dumps, whose place and
// format change between versions (jaxlib 0.11 forms command buffers after HLO).
//
// Each handler that declares ffi::Traits::kCmdBufferCompatible calls, in its execute stage only,
//   GPUEXT_COUNT_EXECUTE("gpuext_<target>", stream);
// The nanobind modules expose the counts (execute_stats_module.h). Counting is off until Python
// turns it on (tests only): an off counter costs one relaxed atomic load per call.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

namespace gpuext {

struct ExecuteCounter {
  explicit ExecuteCounter(const char* t) : target(t) {}
  const char* target;                   // the FFI target name (a string literal)
  std::atomic<uint64_t> calls{0};       // execute-stage runs while counting was on
  std::atomic<uint64_t> captured{0};    // ... of which on a stream in an active capture
};

struct ExecuteStatsRegistry {
  std::atomic<bool> enabled{false};
  std::mutex mu;                          // guards `counters` (the list; the counts are atomics)
  std::vector<ExecuteCounter*> counters;  // never freed: a handler may run during process exit
};

// One registry per shared object: an inline function's static is merged across the translation
// units of one module (_cuda and _nvshmem each have their own, as each has its own handlers).
inline ExecuteStatsRegistry& ExecuteStats() {
  static auto* registry = new ExecuteStatsRegistry();
  return *registry;
}

// The counter of `target`, made on first request. Handlers sharing a target share its counter.
inline ExecuteCounter& RegisterExecuteCounter(const char* target) {
  ExecuteStatsRegistry& r = ExecuteStats();
  std::lock_guard<std::mutex> lock(r.mu);
  for (ExecuteCounter* c : r.counters) {
    if (std::strcmp(c->target, target) == 0) return *c;
  }
  r.counters.push_back(new ExecuteCounter(target));
  return *r.counters.back();
}

inline void RecordExecute(ExecuteCounter& c, bool captured) {
  c.calls.fetch_add(1, std::memory_order_relaxed);
  if (captured) c.captured.fetch_add(1, std::memory_order_relaxed);
}

// Whether `stream` is in an active capture. cudaStreamIsCapturing is one of the calls CUDA allows
// on a capturing stream (unlike cudaStreamQuery, it neither invalidates the capture nor waits).
// XLA never hands a handler the legacy NULL stream, the one stream this query can fail on while
// another is captured; a failure (no driver, say) counts as "not captured" and is cleared, so that
// the handler's own cudaGetLastError checks after its launches do not see it.
inline bool StreamIsCapturing(cudaStream_t stream) {
  if (stream == nullptr) return false;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return status == cudaStreamCaptureStatusActive;
}

inline void CountExecute(ExecuteCounter& c, cudaStream_t stream) {
  if (!ExecuteStats().enabled.load(std::memory_order_relaxed)) return;
  RecordExecute(c, StreamIsCapturing(stream));
}

// One counter per call site, registered while the module loads (a static data member of a class
// template is initialized with the other statics of its translation unit), so execute_stats()
// lists every hooked target before any call ran: a target missing there has no hook, one listed
// with zero calls never ran. `Site` is a local class naming the target (see the macro).
template <typename Site>
struct ExecuteSite {
  static ExecuteCounter& counter;
};
template <typename Site>
ExecuteCounter& ExecuteSite<Site>::counter = RegisterExecuteCounter(Site::Target());

}  // namespace gpuext

// In a handler's execute stage: counts this run of `target` (a string literal) on `stream`.
#define GPUEXT_COUNT_EXECUTE(target, stream)                                              \
  do {                                                                                    \
    struct GpuextExecuteSite {                                                            \
      static const char* Target() { return target; }                                      \
    };                                                                                    \
    ::gpuext::CountExecute(::gpuext::ExecuteSite<GpuextExecuteSite>::counter, (stream)); \
  } while (0)
