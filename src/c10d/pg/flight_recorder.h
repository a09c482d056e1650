// FlightRecorder: a per-process ring buffer of the last N operations issued on every
// ProcessGroup, dumped as JSON when something goes wrong, so that a hang can be diagnosed
// after the fact by comparing the dumps of all ranks (python -m c10d.trace DIR).
//
// Thread-safe: every method may be called from any thread. Recording takes one spin lock
// (core::SpinLock: its sections are a few stores) and writes into a preallocated slot (its
// vectors keep their capacity when the slot is reused), so after warm-up it allocates nothing
// and never logs. record() and record_finished() of one operation take 39 ns together on this
// project's VMs, against 88 with a std::mutex, the group's reference count bumped twice and an
// in-place operation's shapes copied to its outputs (a synchronous all_reduce of 4 B at 2 ranks
// takes 0.6-0.7 us in all). A capacity of 0 (the env var C10D_TRACE_BUFFER_SIZE) turns the
// recorder off: enabled() is false and ProcessGroup skips it.
//
// Dumps happen
//   - on demand: dump_trace_json(), dump_to_file();
//   - on SIGUSR1: the handler only sets a flag; the watcher thread writes the file;
//   - on failure: the first operation to fail with a backend error (timeout, lost peer) dumps
//     this rank's trace at once and adds to the key kDumpRequestKey in the store of every live
//     group, whose watcher threads (on the other ranks) poll that key while they have
//     operations in flight and dump theirs. Automatic dumps happen at most once per process:
//     the first failure is the one worth explaining; later ones are usually its echoes.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "c10d/core/spin_lock.h"
#include "c10d/core/tensor.h"
#include "c10d/core/work.h"
#include "c10d/pg/backend.h"
#include "c10d/pg/options.h"

namespace c10d::store {
class Store;
}

namespace c10d::pg {

// A non-owning view of the tensors of one operation, in any of the shapes the collectives take
// them (or of a DenseView, on the inline fast path). Valid only while the viewed objects are.
class TensorRefs {
 public:
  TensorRefs() = default;
  TensorRefs(const core::Tensor& tensor) : one_(&tensor) {}
  TensorRefs(const std::vector<core::Tensor>& tensors) : list_(&tensors) {}
  TensorRefs(const std::vector<std::vector<core::Tensor>>& lists) : lists_(&lists) {}
  TensorRefs(const DenseView& view) : views_(&view), num_views_(1) {}
  TensorRefs(const DenseView* views, size_t count) : views_(views), num_views_(count) {}

  // Calls fn(ndim, sizes, dtype) for every tensor.
  template <typename Fn>
  void for_each_shape(Fn&& fn) const {
    auto one = [&](const core::Tensor& t) {
      fn(static_cast<int>(t.dim()), t.sizes().data(), t.dtype());
    };
    if (one_) one(*one_);
    if (list_) {
      for (const auto& t : *list_) one(t);
    }
    if (lists_) {
      for (const auto& inner : *lists_) {
        for (const auto& t : inner) one(t);
      }
    }
    for (size_t i = 0; i < num_views_; ++i) fn(views_[i].ndim, views_[i].sizes, views_[i].dtype);
  }
  // Whether both view the same objects (an in-place operation's inputs and outputs).
  bool operator==(const TensorRefs&) const = default;

 private:
  const core::Tensor* one_ = nullptr;
  const std::vector<core::Tensor>* list_ = nullptr;
  const std::vector<std::vector<core::Tensor>>* lists_ = nullptr;
  const DenseView* views_ = nullptr;
  size_t num_views_ = 0;
};

// What ProcessGroup tells the recorder about one operation.
struct TraceOp {
  core::OpType op = core::OpType::kUnknown;
  uint64_t pg_seq = 0;  // ProcessGroup::sequence_number() of this operation
  TensorRefs inputs{};
  TensorRefs outputs{};
  Millis timeout = kUnsetTimeout;  // the operation's own; unset means the group's
  int peer = -1;                   // group rank of the peer of a send/recv
};

// The recorder's view of one ProcessGroup. Shared by the group and by every record of its
// operations, so a dump still names the group after the group itself is gone. All fields but
// uid are guarded by the owning FlightRecorder's lock.
struct TraceGroup {
  uint64_t uid = 0;
  std::string name;
  std::string desc;
  std::string backend;
  int rank = 0;
  int size = 0;
  std::optional<std::vector<int>> global_ranks;
  Millis timeout{0};
  std::weak_ptr<store::Store> store;  // where dump requests are published and polled
  bool closing = false;               // shut down: its failures are not worth a dump
  // Collectives and point-to-point operations are numbered separately (from 1), as a rank
  // may send while its peer does not; the seqs of matching collectives agree across ranks.
  uint64_t collective_seq = 0;
  uint64_t p2p_seq = 0;
  uint64_t last_enqueued = 0;  // collective seqs
  uint64_t last_started = 0;
  uint64_t last_completed = 0;  // completed or failed
  uint64_t last_enqueued_p2p = 0;
  uint64_t last_started_p2p = 0;
  uint64_t last_completed_p2p = 0;
  int64_t in_flight = 0;             // operations recorded and not finished
  int64_t dump_requests_seen = 0;    // kDumpRequestKey's counter when last looked at
  int64_t poll_paused_until_ns = 0;  // after a store error, the watcher leaves it alone a while
};

// One recorded operation, as ProcessGroup holds it until the operation finishes. Empty (false)
// when the recorder is off. It does not own its group: whoever holds it keeps the group alive
// until record_finished (a ProcessGroup owns its TraceGroup; an observer of an asynchronous
// operation holds a reference too), which spares every operation two reference-count updates.
struct TraceHandle {
  uint64_t id = 0;
  uint64_t seq = 0;
  bool p2p = false;
  TraceGroup* group = nullptr;
  explicit operator bool() const { return id != 0; }
};

// The recorder's timestamps, read twice per operation. Where the CPU's time-stamp counter is
// invariant a read is one rdtsc (~10 ns against ~22 for clock_gettime on this project's VMs,
// where a sync all_reduce of 64 B at 2 ranks takes ~0.58 us in all), and a trace's dump
// converts the ticks into wall-clock ns (scale): from the wall-clock time at construction, at
// the rate the monotonic clock and the counter advanced together since. Elsewhere a tick is a
// nanosecond of the system clock.
class TraceClock {
 public:
  TraceClock();
  int64_t now() const;

  // Converts now() values into wall-clock ns since the epoch; 0 stays 0 (no time).
  struct Scale {
    int64_t origin_ticks = 0;
    int64_t origin_ns = 0;
    double ns_per_tick = 1.0;
    int64_t operator()(int64_t ticks) const {
      if (ticks == 0) return 0;
      return origin_ns +
             static_cast<int64_t>(static_cast<double>(ticks - origin_ticks) * ns_per_tick);
    }
  };
  // The conversion as of now.
  Scale scale() const;

 private:
  bool tsc_ = false;
  int64_t origin_ticks_ = 0;
  int64_t origin_wall_ns_ = 0;
  int64_t origin_steady_ns_ = 0;
};

class FlightRecorder {
 public:
  enum class State : uint8_t { kScheduled, kStarted, kCompleted, kFailed };

  // The key, in every group's store, whose counter asks every rank to dump its trace.
  static constexpr const char* kDumpRequestKey = "c10d/trace_dump_request";
  static constexpr const char* kFormatVersion = "1.0";

  // A recorder keeping the last `capacity` operations (0: records nothing).
  explicit FlightRecorder(size_t capacity);
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  // The process's recorder, sized by C10D_TRACE_BUFFER_SIZE; it runs the watcher thread and
  // the SIGUSR1 handler once a group has registered. Never destroyed.
  static FlightRecorder& instance();

  bool enabled() const { return capacity_ != 0; }
  size_t capacity() const { return capacity_; }

  // Registers a group; nullptr when disabled. On the process recorder the first registration
  // starts the watcher thread and installs the SIGUSR1 handler (unless one is installed).
  std::shared_ptr<TraceGroup> register_group(std::shared_ptr<store::Store> store, int rank,
                                             int size, const std::string& backend, Millis timeout);
  void set_group_name(TraceGroup& group, const std::string& name);
  void set_group_desc(TraceGroup& group, const std::string& desc);
  void set_global_ranks(TraceGroup& group, std::vector<int> ranks);
  // The group is shutting down: its later failures trigger no dump.
  void close_group(TraceGroup& group);

  // Records a new operation of `group` as scheduled (or, with `started`, as scheduled and
  // started at once: one lock instead of two on the dispatch path); an empty handle when
  // disabled.
  TraceHandle record(const std::shared_ptr<TraceGroup>& group, const TraceOp& op,
                     bool started = false);
  // The backend was called: the operation is running. A record already overwritten by newer
  // ones is left alone.
  void record_started(const TraceHandle& handle);
  // The operation finished; `error` is null on success. A failure with a backend error
  // (DistBackendError, DistTimeoutError, DistNetworkError) on a group not shutting down
  // triggers the automatic dump, on this thread, before this returns.
  void record_finished(const TraceHandle& handle, std::exception_ptr error);

  // The trace as JSON (see trace.py for the format). Without include_completed, successful
  // operations are left out; with only_active, only operations still in flight.
  std::string dump_trace_json(bool include_completed = true, bool only_active = false) const;
  // The job this process belongs to (every rank of a job the same; init_process_group sets
  // it): dumps carry it, and their file names too, so that jobs sharing a dump directory do
  // not overwrite or mix with each other's. Kept to [A-Za-z0-9._-], at most 64 characters.
  void set_job(const std::string& job);
  std::string job() const;
  // Writes the trace to <C10D_TRACE_DUMP_DIR>/c10d_trace_<job>_rank<rank>.json
  // (c10d_trace_rank<rank>.json without a job; atomically, through a rename) and returns the
  // path; throws DistError naming the path on I/O failure.
  std::string dump_to_file(const std::string& reason) const;
  // The global rank the dump file is named after: the first registered group's rank (mapped
  // through its global ranks), else the RANK env var, else -1.
  int dump_rank() const;

  // Asks every rank sharing a live group with this one to dump (adds to kDumpRequestKey in
  // each group's store). Store errors are swallowed: the stores may be what failed.
  void publish_dump_request();

  // Runs the automatic dump (the file, then the request to the other ranks when `publish`)
  // unless one already ran in this process; true if this call did it.
  bool auto_dump(const std::string& reason, bool publish = true);
  bool auto_dumped() const { return auto_dumped_.load(); }

  // Checks, once, the stores of the groups with operations in flight for a dump request from
  // another rank and dumps if there is a new one. The watcher thread calls it every 100 ms.
  void poll_dump_requests();

 private:
  struct Entry;

  Entry* find(uint64_t id);      // expects lock_ held
  int dump_rank_locked() const;  // expects lock_ held
  std::string dump_json_locked(bool include_completed, bool only_active, const std::string& reason,
                               int indent) const;  // lock_ held
  void start_watcher();
  void watch();

  const size_t capacity_;
  const TraceClock clock_;
  bool process_recorder_ = false;  // instance(): owns the watcher thread and SIGUSR1 handler

  mutable core::SpinLock lock_;
  std::vector<Entry> ring_;                        // guarded by lock_; grows to capacity_
  uint64_t next_id_ = 1;                           // guarded by lock_
  uint64_t next_group_uid_ = 1;                    // guarded by lock_
  std::vector<std::weak_ptr<TraceGroup>> groups_;  // guarded by lock_, registration order
  int64_t in_flight_ = 0;                          // guarded by lock_
  std::string job_;                                // guarded by lock_

  std::atomic<bool> auto_dumped_{false};

  std::mutex watcher_mutex_;
  std::condition_variable watcher_cv_;
  bool watcher_stop_ = false;  // guarded by watcher_mutex_
  std::thread watcher_;
};

std::string_view trace_state_name(FlightRecorder::State state);
// Lower-case operation name used in traces ("allreduce", "_allgather_base", "recv").
std::string trace_op_name(core::OpType op);

}  // namespace c10d::pg
