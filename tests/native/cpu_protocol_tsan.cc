// ThreadSanitizer driver for the CPU all-reduce protocol (csrc/allreduce/cpu_protocol.cc):
// host threads play the ranks, as XLA's CPU runtime does, through one_shot and two_shot with
// several chunks per call and several calls per site, then a group with a missing rank that
// must time out naming it. Checks the sums; TSan checks the flag/heap protocol for races.
// Built and run by .ci/sanitizers.sh (g++ -fsanitize=thread).
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "csrc/allreduce/cpu_protocol.h"

using namespace gpuext::allreduce;

static int failures = 0;

static void Run(Algorithm algorithm, int n, int64_t count, int64_t workspace, int calls, int64_t site) {
  std::vector<std::vector<float>> in(n, std::vector<float>(count)), out(n, std::vector<float>(count));
  for (int call = 0; call < calls; ++call) {
    for (int r = 0; r < n; ++r)
      for (int64_t i = 0; i < count; ++i) in[r][i] = float(r + 1) * float(i % 7 + call);
    std::vector<std::thread> threads;
    std::vector<std::string> errors(n);
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        CpuAllReduceArgs a;
        a.in = in[r].data(); a.out = out[r].data(); a.count = count; a.dtype = DType::kF32;
        a.op = ReduceOp::kSum; a.algorithm = algorithm; a.rank = r; a.group_size = n; a.site = site;
        a.workspace_bytes = workspace; a.timeout_s = 30;
        gpuext::Status s = CpuAllReduce(a);
        if (!s.ok()) errors[r] = s.message();
      });
    for (auto& t : threads) t.join();
    const float ranks = float(n * (n + 1) / 2);
    for (int r = 0; r < n; ++r) {
      if (!errors[r].empty()) { std::printf("FAIL rank %d: %s\n", r, errors[r].c_str()); ++failures; continue; }
      for (int64_t i = 0; i < count; ++i)
        if (out[r][i] != ranks * float(i % 7 + call)) { std::printf("FAIL wrong sum at %ld\n", long(i)); ++failures; break; }
    }
  }
}

int main() {
  // 64 floats per rank per chunk (one_shot) / per segment pair (two_shot): 1000 elements take many chunks.
  for (Algorithm alg : {Algorithm::kOneShot, Algorithm::kTwoShot})
    for (int n : {2, 3, 4}) Run(alg, n, 1000, 64 * 4 * 2 * n, 3, 100 * int(alg) + n);
  // Rank 1 of 2 never arrives: rank 0 must fail within its timeout and name PE 1.
  std::vector<float> x(16, 1.f), y(16);
  CpuAllReduceArgs a;
  a.in = x.data(); a.out = y.data(); a.count = 16; a.group_size = 2; a.rank = 0; a.site = 999;
  a.workspace_bytes = 1 << 12; a.timeout_s = 0.2;
  gpuext::Status s = CpuAllReduce(a);
  if (s.ok() || s.message().find("PEs [1]") == std::string::npos) {
    std::printf("FAIL timeout: %s\n", s.ok() ? "returned ok" : s.message().c_str());
    ++failures;
  }
  // Two callers claim rank 0 of a group of 2 at once (rank 1 never comes): both must fail at
  // once, naming the rank and color, instead of sharing slots and epochs (issue 26).
  {
    std::vector<float> x0(16, 1.f), x1(16, 2.f), y0(16), y1(16);
    std::string e0, e1;
    auto claim = [](const float* in, float* out, std::string* err) {
      CpuAllReduceArgs d;
      d.in = in; d.out = out; d.count = 16; d.group_size = 2; d.rank = 0; d.color = 7; d.site = 1000;
      d.workspace_bytes = 1 << 12; d.timeout_s = 20;
      gpuext::Status st = CpuAllReduce(d);
      *err = st.ok() ? "returned ok" : st.message();
    };
    std::thread t0(claim, x0.data(), y0.data(), &e0), t1(claim, x1.data(), y1.data(), &e1);
    t0.join();
    t1.join();
    for (const std::string* e : {&e0, &e1})
      if (e->find("rank 0 of all_reduce group color 7") == std::string::npos) {
        std::printf("FAIL duplicate rank: %s\n", e->c_str());
        ++failures;
      }
  }
  // The same without overlap: devices 0 and 2 complete execution 5 as ranks 0 and 1, then device 1
  // claims rank 0 of execution 5 again. Timing cannot show it; the device can. A loop (one device
  // per rank, several calls in one execution) is fine.
  {
    auto call = [](int rank, int64_t device, int64_t run, int64_t site, std::string* err) {
      std::vector<float> x(16, float(rank + 1)), y(16);
      CpuAllReduceArgs d;
      d.in = x.data(); d.out = y.data(); d.count = 16; d.group_size = 2; d.rank = rank; d.site = site;
      d.workspace_bytes = 1 << 12; d.timeout_s = 20; d.run_id = run; d.device = device;
      gpuext::Status st = CpuAllReduce(d);
      *err = st.ok() ? (y[0] == 3.f ? "" : "wrong sum") : st.message();
    };
    for (int iteration = 0; iteration < 3; ++iteration) {  // a loop: three calls in execution 6
      std::string e0, e1;
      std::thread t0(call, 0, 0, 6, 1001, &e0), t1(call, 1, 2, 6, 1001, &e1);
      t0.join();
      t1.join();
      if (!e0.empty() || !e1.empty()) { std::printf("FAIL loop: %s %s\n", e0.c_str(), e1.c_str()); ++failures; }
    }
    std::string e0, e1, e2;
    std::thread t0(call, 0, 0, 5, 1002, &e0), t1(call, 1, 2, 5, 1002, &e1);
    t0.join();
    t1.join();
    call(0, 1, 5, 1002, &e2);  // device 1 claims rank 0 of the same execution
    if (!e0.empty() || !e1.empty() || e2.find("claimed by devices 0 and 1") == std::string::npos) {
      std::printf("FAIL duplicate rank across time: '%s' '%s' '%s'\n", e0.c_str(), e1.c_str(), e2.c_str());
      ++failures;
    }
  }
  // Nothing outlives the calls but the failed groups' errors (three above): no heap, no group.
  const CpuAllReduceState st = CpuAllReduceLiveState();
  if (st.live_groups != 0 || st.heap_bytes != 0 || st.failed_groups != 3) {
    std::printf("FAIL live state after the calls: %ld groups, %ld heap bytes, %ld failed\n", long(st.live_groups),
                long(st.heap_bytes), long(st.failed_groups));
    ++failures;
  }
  std::printf("cpu_protocol_tsan: %s\n", failures ? "FAILED" : "ok");
  return failures ? 1 : 0;
}
