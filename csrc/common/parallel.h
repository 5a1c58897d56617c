// Splitting a loop across a thread pool the caller provides (XLA's CPU FFI pool in the
// handlers), so csrc/ needs no XLA header. The calling thread works too and the call returns
// when every part is done; a pool that runs tasks late, inline, or never still ends correctly
// (XLA's FFI: "it is unsafe to assume that all scheduled tasks can be executed in parallel").
#pragma once

#include <cstdint>
#include <functional>

namespace gpuext {

class TaskRunner {
 public:
  virtual ~TaskRunner() = default;
  virtual int64_t workers() const = 0;  // threads that may run tasks, the caller's included
  virtual void Schedule(std::function<void()> task) const = 0;
};

// Calls body(begin, end) over [0, units) in parts whose boundaries are multiples of `grain`,
// using at most runner->workers() threads, and none beyond the first when units * unit_cost
// (roughly elements touched) is too small to pay for waking another thread.
void ParallelFor(const TaskRunner* runner, int64_t units, int64_t grain, int64_t unit_cost,
                 const std::function<void(int64_t, int64_t)>& body);

}  // namespace gpuext
