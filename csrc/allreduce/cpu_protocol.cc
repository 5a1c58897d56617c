#include "csrc/allreduce/cpu_protocol.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace gpuext::allreduce {
namespace {

using Clock = std::chrono::steady_clock;

// The emulated symmetric heap of one group at one call site. Flag arrays are indexed
// [owner * n + peer] and live "in the owner's memory": writers set them, owners spin on
// them, exactly as the GPU kernels spin on local symmetric memory that peers signal.
//
// Lifetime (issue 26: every trace used to leave its n * workspace bytes behind for good): a group
// lives while one of its ranks is inside a call (Registry::Enter / Leave). When the last one
// leaves, the group is freed; the next call at that site makes a fresh one whose epochs all start
// at 0 again, which is consistent because no rank is inside the old one. A rank that returns
// early and calls again while a slow peer is still inside finds the old group, so its epochs
// keep agreeing with that peer's.
struct Group {
  Group(int n, int64_t ws) : n(n), workspace_bytes(ws), heap(n), epoch(n, 0) {
    // Not zero-filled: the protocol reads only what a peer wrote in the same epoch, and leaving
    // the pages untouched keeps a call that moves few bytes from faulting in the whole workspace.
    for (auto& h : heap) h.reset(new unsigned char[static_cast<size_t>(ws)]);
    posted.reset(new std::atomic<uint64_t>[n * n]);
    gathered.reset(new std::atomic<uint64_t>[n * n]);
    consumed.reset(new std::atomic<uint64_t>[n * n]);
    for (int i = 0; i < n * n; ++i) posted[i] = gathered[i] = consumed[i] = 0;
    claimed.reset(new std::atomic<bool>[n]);
    for (int i = 0; i < n; ++i) claimed[i] = false;
  }
  const int n;
  const int64_t workspace_bytes;
  std::vector<std::unique_ptr<unsigned char[]>> heap;    // heap[r]: rank r's workspace
  std::unique_ptr<std::atomic<uint64_t>[]> posted;      // [r*n+s]: s's phase-1 data is in r's heap
  std::unique_ptr<std::atomic<uint64_t>[]> gathered;    // [r*n+s]: s's reduced segment is in r's heap
  std::unique_ptr<std::atomic<uint64_t>[]> consumed;    // [w*n+r]: r has read what w wrote
  std::unique_ptr<std::atomic<bool>[]> claimed;         // [r]: a caller is inside as rank r
  std::vector<uint64_t> epoch;  // epoch[r] is touched only by rank r's thread
  std::atomic<bool> failed{false};
  std::mutex error_mu;
  std::string error;
  int inside = 0;  // callers inside a call; guarded by the registry's mutex

  void Fail(const std::string& msg) {
    std::lock_guard<std::mutex> lock(error_mu);
    if (!failed.load()) error = msg;
    failed.store(true, std::memory_order_release);
  }
  std::string Error() {
    std::lock_guard<std::mutex> lock(error_mu);
    return error;
  }
};

using GroupKey = std::tuple<int64_t, int64_t, int, int64_t>;  // site, color, n, workspace
using ClaimKey = std::tuple<int64_t, int64_t, int64_t>;       // site, color, run

// Which device claimed each rank of a group in one execution. In a correct SPMD program every rank
// is one device, the same one on every call of the execution (a loop calls the same site many
// times, from the same devices). Two devices with one rank (rank operands that are not distinct
// lax.axis_index values) otherwise pair up with the other ranks in whatever order the threads run,
// and each gets a sum of a different subset: sums that change from call to call (issue 26). Timing
// cannot tell that from a loop; device identity can. Bounded: the oldest executions are forgotten
// (a duplicate claim comes within its own execution, long before that).
class ClaimBook {
 public:
  static constexpr size_t kMaxEntries = 4096;

  // The device that claimed `rank` earlier in this execution when it is not `device`, else -1.
  int64_t Claim(const CpuAllReduceArgs& a) {
    if (a.device < 0) return -1;
    const ClaimKey key(a.site, a.color, a.run_id);
    auto it = book_.find(key);
    if (it == book_.end()) {
      if (book_.size() >= kMaxEntries) {
        book_.erase(order_.front());
        order_.pop_front();
      }
      it = book_.emplace(key, std::vector<int64_t>(static_cast<size_t>(a.group_size), -1)).first;
      order_.push_back(key);
    }
    int64_t& owner = it->second[static_cast<size_t>(a.rank)];
    if (owner < 0) owner = a.device;
    return owner == a.device ? -1 : owner;
  }

 private:
  std::map<ClaimKey, std::vector<int64_t>> book_;
  std::deque<ClaimKey> order_;
};

// The groups with a call in flight, and what is left of the groups that failed: their error only
// (the heap is freed), so that a later call at that site fails at once instead of pairing with the
// wrong epoch of a peer that arrives late. The map of failures grows by one string per failed
// site; nothing else outlives the calls.
class Registry {
 public:
  Status Enter(const CpuAllReduceArgs& a, std::shared_ptr<Group>* out) {
    const GroupKey key(a.site, a.color, a.group_size, a.workspace_bytes);
    std::lock_guard<std::mutex> lock(mu_);
    if (auto f = failed_.find(key); f != failed_.end())
      return Status::Error("this all_reduce group failed earlier and its epochs no longer agree "
                           "(re-trace to get a fresh one): " + f->second);
    if (const int64_t other = claims_.Claim(a); other >= 0) {
      const std::string msg = "rank " + std::to_string(a.rank) + " of all_reduce group color " +
                              std::to_string(a.color) + " (group size " + std::to_string(a.group_size) +
                              ", call site " + std::to_string(a.site) + ") was claimed by devices " +
                              std::to_string(other) + " and " + std::to_string(a.device) +
                              " in one execution: the rank and color operands must identify each device of "
                              "the group once (lax.axis_index)";
      failed_[key] = msg;  // its peers, waiting now or arriving later, fail too
      if (auto live = live_.find(key); live != live_.end()) live->second->Fail(msg);
      return Status::Error(msg);
    }
    auto it = live_.find(key);
    if (it == live_.end()) {  // (an allocation failure throws here, before the map changes)
      it = live_.emplace(key, std::make_shared<Group>(a.group_size, a.workspace_bytes)).first;
      heap_bytes_ += int64_t{a.group_size} * a.workspace_bytes;
    }
    ++it->second->inside;
    *out = it->second;
    return Status::Ok();
  }

  void Leave(const CpuAllReduceArgs& a, const std::shared_ptr<Group>& g) {
    const GroupKey key(a.site, a.color, a.group_size, a.workspace_bytes);
    std::lock_guard<std::mutex> lock(mu_);
    if (--g->inside > 0) return;
    if (g->failed.load(std::memory_order_acquire)) failed_[key] = g->Error();
    heap_bytes_ -= int64_t{g->n} * g->workspace_bytes;
    live_.erase(key);
  }

  CpuAllReduceState State() {
    std::lock_guard<std::mutex> lock(mu_);
    return {int64_t(live_.size()), heap_bytes_, int64_t(failed_.size())};
  }

 private:
  std::mutex mu_;
  std::map<GroupKey, std::shared_ptr<Group>> live_;
  std::map<GroupKey, std::string> failed_;
  ClaimBook claims_;
  int64_t heap_bytes_ = 0;
};

Registry& Groups() {
  static auto* registry = new Registry();  // never destroyed: XLA threads may call during exit
  return *registry;
}

std::string RankList(const std::vector<int>& ranks) {
  std::string s = "[";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s + "]";
}

class Protocol {
 public:
  Protocol(const CpuAllReduceArgs& a, Group& g)
      : a_(a), g_(g), n_(a.group_size), r_(a.rank),
        deadline_(Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(a.timeout_s))) {}

  // Waits until flags[r*n + s] >= target for every peer s (r == this rank: the flags live in
  // this rank's memory). On timeout: fails the group and names the ranks that are missing.
  Status Wait(const std::atomic<uint64_t>* flags, uint64_t target, const char* what) {
    for (uint64_t spin = 0;; ++spin) {
      bool all = true;
      for (int s = 0; s < n_ && all; ++s)
        all = Flag(flags, s).load(std::memory_order_acquire) >= target;
      if (all) return Status::Ok();
      if (g_.failed.load(std::memory_order_acquire))
        return Status::Error("a peer in this group failed first: " + g_.Error());
      // Poll the clock every few spins; yield so that peers sharing our core get to run.
      if ((spin & 63) == 0 && Clock::now() > deadline_) return TimedOut(flags, target, what);
      std::this_thread::yield();
    }
  }

  Status Run() {
    const int w = ByteWidth(a_.dtype);
    const int64_t chunk = ChunkElements(a_.algorithm, n_, g_.workspace_bytes, w);
    if (chunk <= 0) return Status::Error("workspace_bytes too small for one element per rank");
    for (int64_t off = 0; off < a_.count; off += chunk) {
      const int64_t len = std::min(chunk, a_.count - off);
      const uint64_t e = ++g_.epoch[r_];
      // The slots this rank writes into may still be read by a slow peer's previous chunk.
      GPUEXT_RETURN_IF_ERROR(Wait(g_.consumed.get(), e - 1, "peers to release the workspace"));
      Status s = a_.algorithm == Algorithm::kTwoShot ? TwoShotChunk(off, len, chunk / n_, e)
                                                     : OneShotChunk(off, len, chunk, e);
      if (!s.ok()) return s;
      // Tell every writer that its slots in this rank's heap are free again.
      for (int p = 0; p < n_; ++p) g_.consumed[p * n_ + r_].store(e, std::memory_order_release);
    }
    return Status::Ok();
  }

 private:
  const std::atomic<uint64_t>& Flag(const std::atomic<uint64_t>* flags, int s) const { return flags[r_ * n_ + s]; }

  Status TimedOut(const std::atomic<uint64_t>* flags, uint64_t target, const char* what) {
    std::vector<int> missing;
    for (int s = 0; s < n_; ++s)
      if (Flag(flags, s).load(std::memory_order_acquire) < target) missing.push_back(s);
    std::string msg = "all_reduce timed out after " + std::to_string(a_.timeout_s) + " s waiting for " + what +
                      ": PEs " + RankList(missing) + " of group size " + std::to_string(n_) +
                      " did not arrive (this is PE " + std::to_string(r_) + ", call site " +
                      std::to_string(a_.site) + ", epoch " + std::to_string(target) +
                      "). If every device did call all_reduce, XLA ran the devices' computations on too "
                      "few threads to meet (docs/allreduce.md, 'Deadlocks').";
    g_.Fail(msg);
    return Status::Error(msg);
  }

  unsigned char* Heap(int p) { return g_.heap[p].get(); }
  const unsigned char* In() const { return static_cast<const unsigned char*>(a_.in); }
  unsigned char* Out() const { return static_cast<unsigned char*>(a_.out); }

  // out[dst..dst+len) = reduction over s of slot(s)[0..len), in rank order.
  void Reduce(unsigned char* dst, int64_t len, const unsigned char* first_slot, int64_t slot_stride) {
    VisitDType(a_.dtype, [&](auto dtag) {
      using E = Elem<decltype(dtag)::value>;
      using S = typename E::Storage;
      VisitOp(a_.op, [&](auto otag) {
        S* o = reinterpret_cast<S*>(dst);
        for (int64_t i = 0; i < len; ++i) {
          auto acc = E::Load(reinterpret_cast<const S*>(first_slot)[i]);
          for (int s = 1; s < n_; ++s)
            acc = Combine<decltype(otag)::value>(
                acc, E::Load(reinterpret_cast<const S*>(first_slot + s * slot_stride)[i]));
          o[i] = E::Store(acc);
        }
      });
    });
  }

  // Push my chunk into slot r of every peer's heap, signal, wait for all, reduce locally.
  Status OneShotChunk(int64_t off, int64_t len, int64_t chunk, uint64_t e) {
    const int w = ByteWidth(a_.dtype);
    const int64_t slot = chunk * w;
    for (int p = 0; p < n_; ++p) {
      std::memcpy(Heap(p) + r_ * slot, In() + off * w, len * w);
      g_.posted[p * n_ + r_].store(e, std::memory_order_release);
    }
    GPUEXT_RETURN_IF_ERROR(Wait(g_.posted.get(), e, "one_shot data"));
    Reduce(Out() + off * w, len, Heap(r_), slot);
    return Status::Ok();
  }

  // Reduce-scatter (segment p of my chunk goes to PE p), reduce my segment, all-gather it.
  Status TwoShotChunk(int64_t off, int64_t len, int64_t seg, uint64_t e) {
    const int w = ByteWidth(a_.dtype);
    const int64_t seg_bytes = seg * w;
    // Layout of each heap: [n reduce-scatter segments][n all-gather segments], by writer.
    auto seg_len = [&](int p) { return std::clamp<int64_t>(len - p * seg, 0, seg); };
    for (int p = 0; p < n_; ++p) {
      std::memcpy(Heap(p) + r_ * seg_bytes, In() + (off + p * seg) * w, seg_len(p) * w);
      g_.posted[p * n_ + r_].store(e, std::memory_order_release);
    }
    GPUEXT_RETURN_IF_ERROR(Wait(g_.posted.get(), e, "two_shot reduce-scatter data"));
    unsigned char* mine = Out() + (off + r_ * seg) * w;
    Reduce(mine, seg_len(r_), Heap(r_), seg_bytes);
    for (int p = 0; p < n_; ++p) {
      std::memcpy(Heap(p) + (n_ + r_) * seg_bytes, mine, seg_len(r_) * w);
      g_.gathered[p * n_ + r_].store(e, std::memory_order_release);
    }
    GPUEXT_RETURN_IF_ERROR(Wait(g_.gathered.get(), e, "two_shot all-gather data"));
    for (int s = 0; s < n_; ++s)
      if (s != r_) std::memcpy(Out() + (off + s * seg) * w, Heap(r_) + (n_ + s) * seg_bytes, seg_len(s) * w);
    return Status::Ok();
  }

  const CpuAllReduceArgs& a_;
  Group& g_;
  const int n_, r_;
  const Clock::time_point deadline_;
};

}  // namespace

int64_t ChunkElements(Algorithm algorithm, int group_size, int64_t workspace_bytes, int element_bytes) {
  if (algorithm == Algorithm::kTwoShot)  // n reduce-scatter + n all-gather segments per heap
    return workspace_bytes / (2 * int64_t{group_size} * element_bytes) * group_size;
  return workspace_bytes / (int64_t{group_size} * element_bytes);  // n slots of one chunk each
}

Status CpuAllReduce(const CpuAllReduceArgs& a) {
  if (a.group_size < 1 || a.rank < 0 || a.rank >= a.group_size)
    return Status::Error("rank " + std::to_string(a.rank) + " outside group of size " + std::to_string(a.group_size));
  if (a.count == 0) return Status::Ok();
  if (a.group_size == 1) {
    std::memcpy(a.out, a.in, static_cast<size_t>(a.count) * ByteWidth(a.dtype));
    return Status::Ok();
  }
  std::shared_ptr<Group> g;
  GPUEXT_RETURN_IF_ERROR(Groups().Enter(a, &g));
  Status s = Status::Ok();
  // One caller per rank slot at a time. Two callers with the same (rank, color) -- rank/color
  // operands that are not distinct lax.axis_index values, or two overlapping executions of one
  // program -- would write the same slots and read each other's epochs: sums that change from
  // call to call (issue 26). The second claim fails the group, so both callers return the error.
  const bool owner = !g->claimed[a.rank].exchange(true, std::memory_order_acq_rel);
  if (!owner) {
    const std::string msg = "rank " + std::to_string(a.rank) + " of all_reduce group color " + std::to_string(a.color) +
                            " (group size " + std::to_string(a.group_size) + ", call site " + std::to_string(a.site) +
                            ") was claimed by two callers at once: the rank and color operands must identify "
                            "each device of the group once (lax.axis_index), and one program's executions must "
                            "not overlap";
    g->Fail(msg);
    s = Status::Error(msg);
  } else if (g->failed.load(std::memory_order_acquire)) {
    s = Status::Error("this all_reduce group failed earlier and its epochs no longer agree "
                      "(re-trace to get a fresh one): " + g->Error());
  } else {
    s = Protocol(a, *g).Run();
  }
  if (owner) g->claimed[a.rank].store(false, std::memory_order_release);
  Groups().Leave(a, g);
  return s;
}

CpuAllReduceState CpuAllReduceLiveState() { return Groups().State(); }

}  // namespace gpuext::allreduce
