// The Python side of execute_stats.h, added by each module that links command-buffer-compatible
// handlers (_cuda, _nvshmem). tests/_command_buffer.py is the user.
#pragma once

#include <nanobind/nanobind.h>

#include <mutex>

#include "ffi/common/execute_stats.h"

namespace gpuext {

inline void AddExecuteStatsFunctions(nanobind::module_& m) {
  namespace nb = nanobind;
  // {target: {"calls": n, "captured": c}} for every hooked handler of this module, counted since
  // the last reset while counting was on.
  m.def("execute_stats", []() {
    ExecuteStatsRegistry& r = ExecuteStats();
    nb::dict out;
    std::lock_guard<std::mutex> lock(r.mu);
    for (const ExecuteCounter* c : r.counters) {
      nb::dict d;
      d["calls"] = c->calls.load(std::memory_order_relaxed);
      d["captured"] = c->captured.load(std::memory_order_relaxed);
      out[c->target] = d;
    }
    return out;
  });
  m.def("reset_execute_stats", []() {
    ExecuteStatsRegistry& r = ExecuteStats();
    std::lock_guard<std::mutex> lock(r.mu);
    for (ExecuteCounter* c : r.counters) {
      c->calls.store(0, std::memory_order_relaxed);
      c->captured.store(0, std::memory_order_relaxed);
    }
  });
  // Counting costs a driver query per call, so it is off unless a test turns it on. Returns the
  // previous setting, so a caller can restore it.
  m.def(
      "set_execute_stats_enabled",
      [](bool on) { return ExecuteStats().enabled.exchange(on, std::memory_order_relaxed); },
      nb::arg("enabled"));
}

}  // namespace gpuext
