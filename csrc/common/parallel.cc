#include "csrc/common/parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>

namespace gpuext {
namespace {

// Below this many elements a second thread costs more (wake-up, cache traffic) than it saves.
constexpr int64_t kMinCostPerThread = 1 << 16;
// Parts per thread: uneven parts (partial blocks, slow-path blocks) still balance.
constexpr int64_t kPartsPerWorker = 4;

struct Shared {
  std::function<void(int64_t, int64_t)> body;
  int64_t units = 0, part_units = 0, parts = 0;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::mutex mu;
  std::condition_variable cv;

  // Takes parts until none is left; returns when this thread has no more to do.
  void Work() {
    for (int64_t p; (p = next.fetch_add(1)) < parts;) {
      const int64_t begin = p * part_units, end = std::min(units, begin + part_units);
      body(begin, end);
      if (done.fetch_add(1) + 1 == parts) {
        std::lock_guard<std::mutex> lock(mu);
        cv.notify_all();
      }
    }
  }
};

}  // namespace

void ParallelFor(const TaskRunner* runner, int64_t units, int64_t grain, int64_t unit_cost,
                 const std::function<void(int64_t, int64_t)>& body) {
  if (units <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t grains = (units + grain - 1) / grain;
  const int64_t by_cost = std::max<int64_t>(1, units * std::max<int64_t>(unit_cost, 1) / kMinCostPerThread);
  const int64_t workers = runner ? std::min({runner->workers(), by_cost, grains}) : 1;
  if (workers <= 1) {
    body(0, units);
    return;
  }
  auto s = std::make_shared<Shared>();
  s->body = body;
  s->units = units;
  const int64_t parts = std::min(grains, workers * kPartsPerWorker);
  s->part_units = (grains + parts - 1) / parts * grain;
  s->parts = (units + s->part_units - 1) / s->part_units;
  // Helpers hold the state: one that starts after the caller returned finds no part and exits.
  for (int64_t w = 1; w < workers; ++w) runner->Schedule([s] { s->Work(); });
  s->Work();
  std::unique_lock<std::mutex> lock(s->mu);
  s->cv.wait(lock, [&] { return s->done.load() == s->parts; });
}

}  // namespace gpuext
