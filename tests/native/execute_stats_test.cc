// Checks ffi/common/execute_stats.h, the capture counters of our command-buffer-compatible CUDA
// handlers, where only the CUDA headers and cudart are at hand (no GPU needed): every hooked
// target is listed from load time (once, however many sites hook it), nothing is counted while
// counting is off, counts from many threads are exact, and a call on no stream counts as not
// captured. Where a GPU is present it also counts a call inside a real stream capture and one
// outside it, and checks that the query leaves no CUDA error behind.
// Built and run by tests/common/test_command_buffer_check.py.
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "ffi/common/execute_stats.h"

namespace {

int failures = 0;

#define EXPECT(cond)                                                 \
  do {                                                               \
    if (!(cond)) {                                                   \
      std::printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);    \
      ++failures;                                                    \
    }                                                                \
  } while (0)

void SiteA(cudaStream_t s) { GPUEXT_COUNT_EXECUTE("target_a", s); }
void SiteA2(cudaStream_t s) { GPUEXT_COUNT_EXECUTE("target_a", s); }  // a second site of one target
void SiteB(cudaStream_t s) { GPUEXT_COUNT_EXECUTE("target_b", s); }

const gpuext::ExecuteCounter* Find(const char* target) {
  for (const gpuext::ExecuteCounter* c : gpuext::ExecuteStats().counters)
    if (std::strcmp(c->target, target) == 0) return c;
  return nullptr;
}

uint64_t Calls(const char* t) { return Find(t)->calls.load(); }
uint64_t Captured(const char* t) { return Find(t)->captured.load(); }

void GpuCapture() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    (void)cudaGetLastError();
    std::printf("no GPU: the capture part is not run\n");
    return;
  }
  cudaStream_t stream = nullptr;
  EXPECT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  const uint64_t calls = Calls("target_b"), captured = Captured("target_b");
  SiteB(stream);  // not capturing
  EXPECT(Calls("target_b") == calls + 1 && Captured("target_b") == captured);
  // XLA traces a command buffer's custom calls in thread-local capture mode.
  EXPECT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  SiteB(stream);
  cudaGraph_t graph = nullptr;
  EXPECT(cudaStreamEndCapture(stream, &graph) == cudaSuccess);  // the query did not invalidate it
  EXPECT(Calls("target_b") == calls + 2 && Captured("target_b") == captured + 1);
  EXPECT(cudaGetLastError() == cudaSuccess);
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  std::printf("GPU capture part run\n");
}

}  // namespace

int main() {
  // Listed before any hook ran: registered while the program loaded.
  EXPECT(gpuext::ExecuteStats().counters.size() == 2);
  EXPECT(Find("target_a") != nullptr && Find("target_b") != nullptr);
  if (failures) return 1;

  // Off (the default): a hook counts nothing.
  SiteA(nullptr);
  EXPECT(Calls("target_a") == 0);

  gpuext::ExecuteStats().enabled.store(true);
  SiteA(nullptr);
  SiteA2(nullptr);
  EXPECT(Calls("target_a") == 2 && Captured("target_a") == 0);  // no stream: not captured
  EXPECT(Calls("target_b") == 0);

  // Many threads, both sites: exact totals (atomics).
  constexpr int kThreads = 8, kPerThread = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([t] {
      gpuext::ExecuteCounter& a = *const_cast<gpuext::ExecuteCounter*>(Find("target_a"));
      for (int i = 0; i < kPerThread; ++i) {
        if (t % 2) SiteA2(nullptr); else SiteA(nullptr);
        gpuext::RecordExecute(a, /*captured=*/true);
      }
    });
  for (auto& th : threads) th.join();
  EXPECT(Calls("target_a") == 2 + 2ull * kThreads * kPerThread);
  EXPECT(Captured("target_a") == 1ull * kThreads * kPerThread);

  // Off again: nothing more.
  gpuext::ExecuteStats().enabled.store(false);
  SiteA(nullptr);
  EXPECT(Calls("target_a") == 2 + 2ull * kThreads * kPerThread);

  gpuext::ExecuteStats().enabled.store(true);
  GpuCapture();

  std::printf(failures ? "%d FAILED\n" : "ALL OK\n", failures);
  return failures ? 1 : 0;
}
