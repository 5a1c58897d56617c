#include "csrc/timer/event_table.h"

#include <mutex>
#include <string>

#include "csrc/common/cuda_check.h"
#include "csrc/common/scoped_device.h"

namespace gpuext {
namespace {

struct Slot {
  int device = -1;                    // the device its events belong to (-1: none yet)
  std::vector<cudaEvent_t> events;    // created on demand, reused after a reset
  int64_t count = 0;                  // entries recorded since the last reset
};

struct Table {
  std::mutex mu;
  Slot slots[kTimerSlots];
};

// Never destroyed: a handler may still run while the process exits, after CUDA's own teardown.
Table& GetTable() {
  static auto* table = new Table();
  return *table;
}

Status CheckSlot(int64_t slot, const char* what) {
  if (slot >= 0 && slot < kTimerSlots) return Status::Ok();
  return Status::Error(std::string(what) + " " + std::to_string(slot) + " is not a timer slot (0.." +
                       std::to_string(kTimerSlots - 1) + ")");
}

}  // namespace

Status TimerRecord(int64_t slot, int device, cudaStream_t stream) {
  GPUEXT_RETURN_IF_ERROR(CheckSlot(slot, "slot"));
  Table& t = GetTable();
  std::lock_guard<std::mutex> lock(t.mu);
  Slot& s = t.slots[slot];
  if (s.count >= kTimerMaxEntries)
    return Status::Error("timer slot " + std::to_string(slot) + " is full (" + std::to_string(kTimerMaxEntries) +
                         " entries): reset it between batches");
  ScopedDevice scoped;
  int current = 0;
  GPUEXT_RETURN_IF_ERROR(scoped.Enter(device, &current));
  if (s.device != current) {
    // Events belong to one device; a slot moves to another only while it holds no entries.
    if (s.count > 0)
      return Status::Error("timer slot " + std::to_string(slot) + " holds events of device " +
                           std::to_string(s.device) + ", recorded now on device " + std::to_string(current) +
                           ": reset it first");
    for (cudaEvent_t e : s.events) (void)cudaEventDestroy(e);
    s.events.clear();
    s.device = current;
  }
  if (s.count == static_cast<int64_t>(s.events.size())) {
    cudaEvent_t e = nullptr;
    GPUEXT_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDefault));  // with timing
    s.events.push_back(e);
  }
  GPUEXT_CUDA_RETURN_IF_ERROR(cudaEventRecord(s.events[s.count], stream));
  ++s.count;
  return Status::Ok();
}

Status TimerReset(int64_t slot) {
  if (slot != -1) GPUEXT_RETURN_IF_ERROR(CheckSlot(slot, "slot"));
  Table& t = GetTable();
  std::lock_guard<std::mutex> lock(t.mu);
  for (int64_t i = 0; i < kTimerSlots; ++i) {
    if (slot == -1 || slot == i) t.slots[i].count = 0;
  }
  return Status::Ok();
}

Status TimerCount(int64_t slot, int64_t* count) {
  GPUEXT_RETURN_IF_ERROR(CheckSlot(slot, "slot"));
  Table& t = GetTable();
  std::lock_guard<std::mutex> lock(t.mu);
  *count = t.slots[slot].count;
  return Status::Ok();
}

Status TimerElapsedMs(int64_t start_slot, int64_t end_slot, int64_t shift, std::vector<float>* out) {
  GPUEXT_RETURN_IF_ERROR(CheckSlot(start_slot, "start slot"));
  GPUEXT_RETURN_IF_ERROR(CheckSlot(end_slot, "end slot"));
  out->clear();
  Table& t = GetTable();
  std::lock_guard<std::mutex> lock(t.mu);
  const Slot& a = t.slots[start_slot];
  const Slot& b = t.slots[end_slot];
  if (a.count == 0 || b.count == 0) return Status::Ok();
  if (a.device != b.device)
    return Status::Error("timer slots " + std::to_string(start_slot) + " and " + std::to_string(end_slot) +
                         " hold events of devices " + std::to_string(a.device) + " and " + std::to_string(b.device));
  ScopedDevice scoped;
  int current = 0;
  GPUEXT_RETURN_IF_ERROR(scoped.Enter(a.device, &current));
  for (int64_t i = shift < 0 ? -shift : 0; i < a.count && i + shift < b.count; ++i) {
    cudaEvent_t start = a.events[i], end = b.events[i + shift];
    GPUEXT_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(start));
    GPUEXT_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(end));
    float ms = 0.0f;
    GPUEXT_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start, end));
    out->push_back(ms);
  }
  return Status::Ok();
}

}  // namespace gpuext
