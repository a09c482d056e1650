#include "c10d/pg/flight_recorder.h"

#include <signal.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <cpuid.h>
#include <x86intrin.h>
#endif

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "c10d/core/blocking.h"
#include "c10d/core/clock.h"
#include "c10d/core/env.h"
#include "c10d/core/exception.h"
#include "c10d/store/store.h"

namespace c10d::pg {

using core::OpType;
using core::wall_ns;
using nlohmann::json;

namespace {

constexpr auto kWatchInterval = std::chrono::milliseconds(100);
constexpr int64_t kStorePollPauseNs = 5'000'000'000;  // after a store error
// A second key beside the counter: a line saying who asked for the dump and why.
constexpr const char* kDumpReasonKey = "c10d/trace_dump_reason";

// Set by the SIGUSR1 handler, read by the watcher thread. Lock-free, so async-signal-safe.
std::atomic<bool> g_signal_pending{false};
static_assert(std::atomic<bool>::is_always_lock_free);

extern "C" void on_dump_signal(int) { g_signal_pending.store(true); }

// Installs the SIGUSR1 handler unless the program (or Python) already handles the signal.
void install_signal_handler() {
  struct sigaction current {};
  if (sigaction(SIGUSR1, nullptr, &current) != 0) return;
  if ((current.sa_flags & SA_SIGINFO) != 0 || current.sa_handler != SIG_DFL) return;
  struct sigaction action {};
  action.sa_handler = on_dump_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &action, nullptr);
}

bool is_p2p(OpType op) {
  return op == OpType::kSend || op == OpType::kRecv || op == OpType::kRecvAnySource;
}

std::string hostname() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

size_t capacity_from_env() {
  const int64_t n = core::env_int(core::kEnvTraceBufferSize);
  C10D_CHECK_ARG(n >= 0, core::kEnvTraceBufferSize.name, " must be >= 0, got ", n);
  return static_cast<size_t>(n);
}

// The error's message, and whether it is the kind of failure a dump should explain: a backend
// that timed out, lost a peer or failed on the wire (not a caller's mistake).
std::pair<std::string, bool> classify(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const core::DistTimeoutError& e) {
    return {e.what(), true};
  } catch (const core::DistBackendError& e) {
    return {e.what(), true};
  } catch (const core::DistNetworkError& e) {
    return {e.what(), true};
  } catch (const std::exception& e) {
    return {e.what(), false};
  } catch (...) {
    return {"unknown error", false};
  }
}

}  // namespace

// One slot of the ring. The vectors keep their capacity when the slot is reused, so recording
// into a warm ring does not allocate.
struct FlightRecorder::Entry {
  uint64_t id = 0;  // 0: never used
  std::shared_ptr<TraceGroup> group;
  OpType op = OpType::kUnknown;
  uint64_t seq = 0;
  uint64_t pg_seq = 0;
  bool p2p = false;
  int peer = -1;
  // Tensor i has dims[i] sizes, stored one after another in sizes. An operation in place
  // (outputs_are_inputs) leaves the output fields as they were: its outputs are its inputs.
  std::vector<uint8_t> input_dims, output_dims;
  std::vector<int64_t> input_sizes, output_sizes;
  std::vector<core::DType> input_dtypes, output_dtypes;
  bool outputs_are_inputs = false;
  State state = State::kScheduled;
  std::string error;
  // TraceClock ticks; 0: not yet.
  int64_t enqueued_at = 0;
  int64_t started_at = 0;
  int64_t completed_at = 0;
  int64_t timeout_ms = 0;
};

namespace {

void describe(const TensorRefs& refs, std::vector<uint8_t>& dims, std::vector<int64_t>& sizes,
              std::vector<core::DType>& dtypes) {
  dims.clear();
  sizes.clear();
  dtypes.clear();
  refs.for_each_shape([&](int ndim, const int64_t* shape, core::DType dtype) {
    dims.push_back(static_cast<uint8_t>(std::min(ndim, 255)));
    for (int i = 0; i < ndim && i < 255; ++i) sizes.push_back(shape[i]);
    dtypes.push_back(dtype);
  });
}

json sizes_json(const std::vector<uint8_t>& dims, const std::vector<int64_t>& sizes) {
  json out = json::array();
  size_t at = 0;
  for (uint8_t d : dims) {
    json shape = json::array();
    for (uint8_t i = 0; i < d; ++i) shape.push_back(sizes[at++]);
    out.push_back(std::move(shape));
  }
  return out;
}

json dtypes_json(const std::vector<core::DType>& dtypes) {
  json out = json::array();
  for (auto d : dtypes) out.push_back(std::string(core::dtype_name(d)));
  return out;
}

json time_or_null(int64_t ns) { return ns == 0 ? json(nullptr) : json(ns); }

}  // namespace

std::string_view trace_state_name(FlightRecorder::State state) {
  switch (state) {
    case FlightRecorder::State::kScheduled:
      return "scheduled";
    case FlightRecorder::State::kStarted:
      return "started";
    case FlightRecorder::State::kCompleted:
      return "completed";
    case FlightRecorder::State::kFailed:
      return "failed";
  }
  return "unknown";
}

std::string trace_op_name(OpType op) {
  std::string name(core::op_type_name(op));
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

namespace {
// Whether the time-stamp counter runs at a constant rate in every power state (CPUID
// 0x80000007, EDX bit 8).
bool invariant_tsc() {
#if defined(__x86_64__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(0x80000000, &eax, &ebx, &ecx, &edx) == 0 || eax < 0x80000007) return false;
  if (__get_cpuid(0x80000007, &eax, &ebx, &ecx, &edx) == 0) return false;
  return (edx & (1u << 8)) != 0;
#else
  return false;
#endif
}
}  // namespace

TraceClock::TraceClock()
    : tsc_(invariant_tsc()), origin_ticks_(now()), origin_wall_ns_(wall_ns()),
      origin_steady_ns_(core::now_ns()) {}

int64_t TraceClock::now() const {
#if defined(__x86_64__)
  if (tsc_) return static_cast<int64_t>(__rdtsc());
#endif
  return wall_ns();
}

TraceClock::Scale TraceClock::scale() const {
  if (!tsc_) return {};  // ticks are ns already
  const int64_t elapsed_ticks = now() - origin_ticks_;
  const int64_t elapsed_ns = core::now_ns() - origin_steady_ns_;
  Scale scale{.origin_ticks = origin_ticks_, .origin_ns = origin_wall_ns_};
  // Before a tick has passed (never in practice) any rate will do.
  if (elapsed_ticks > 0 && elapsed_ns > 0) {
    scale.ns_per_tick = static_cast<double>(elapsed_ns) / static_cast<double>(elapsed_ticks);
  }
  return scale;
}

FlightRecorder::FlightRecorder(size_t capacity) : capacity_(capacity) {}

FlightRecorder::~FlightRecorder() {
  {
    std::lock_guard lock(watcher_mutex_);
    watcher_stop_ = true;
  }
  watcher_cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();
}

FlightRecorder& FlightRecorder::instance() {
  // Leaked on purpose: Works finishing on backend threads during exit may still record.
  static FlightRecorder* recorder = [] {
    auto* r = new FlightRecorder(capacity_from_env());
    r->process_recorder_ = true;
    return r;
  }();
  return *recorder;
}

std::shared_ptr<TraceGroup> FlightRecorder::register_group(std::shared_ptr<store::Store> store,
                                                           int rank, int size,
                                                           const std::string& backend,
                                                           Millis timeout) {
  if (!enabled()) return nullptr;
  auto group = std::make_shared<TraceGroup>();
  group->rank = rank;
  group->size = size;
  group->backend = backend;
  group->timeout = timeout;
  group->store = store;
  bool first = false;
  {
    std::lock_guard lock(lock_);
    group->uid = next_group_uid_++;
    std::erase_if(groups_, [](const auto& g) { return g.expired(); });
    groups_.push_back(group);
    first = group->uid == 1;
  }
  if (first && process_recorder_) {
    install_signal_handler();
    start_watcher();
  }
  return group;
}

void FlightRecorder::set_group_name(TraceGroup& group, const std::string& name) {
  std::lock_guard lock(lock_);
  group.name = name;
}

void FlightRecorder::set_group_desc(TraceGroup& group, const std::string& desc) {
  std::lock_guard lock(lock_);
  group.desc = desc;
}

void FlightRecorder::set_global_ranks(TraceGroup& group, std::vector<int> ranks) {
  std::lock_guard lock(lock_);
  group.global_ranks = std::move(ranks);
}

void FlightRecorder::close_group(TraceGroup& group) {
  std::lock_guard lock(lock_);
  group.closing = true;
}

FlightRecorder::Entry* FlightRecorder::find(uint64_t id) {
  if (id == 0 || capacity_ == 0) return nullptr;
  const size_t slot = (id - 1) % capacity_;
  if (slot >= ring_.size() || ring_[slot].id != id) return nullptr;
  return &ring_[slot];
}

TraceHandle FlightRecorder::record(const std::shared_ptr<TraceGroup>& group, const TraceOp& op,
                                   bool started) {
  if (!enabled() || !group) return {};
  const int64_t now = clock_.now();
  TraceHandle handle;
  handle.p2p = is_p2p(op.op);
  handle.group = group.get();
  std::lock_guard lock(lock_);
  handle.id = next_id_++;
  TraceGroup& g = *group;
  handle.seq = handle.p2p ? ++g.p2p_seq : ++g.collective_seq;
  (handle.p2p ? g.last_enqueued_p2p : g.last_enqueued) = handle.seq;
  if (started) (handle.p2p ? g.last_started_p2p : g.last_started) = handle.seq;
  ++g.in_flight;
  ++in_flight_;

  const size_t slot = (handle.id - 1) % capacity_;
  if (slot == ring_.size()) ring_.emplace_back();  // warm-up: the ring fills in id order
  Entry& e = ring_[slot];
  e.id = handle.id;
  if (e.group != group) e.group = group;  // the same group, usually: no reference counting
  e.op = op.op;
  e.seq = handle.seq;
  e.pg_seq = op.pg_seq;
  e.p2p = handle.p2p;
  e.peer = op.peer;
  describe(op.inputs, e.input_dims, e.input_sizes, e.input_dtypes);
  e.outputs_are_inputs = op.outputs == op.inputs;
  if (!e.outputs_are_inputs) describe(op.outputs, e.output_dims, e.output_sizes, e.output_dtypes);
  e.state = started ? State::kStarted : State::kScheduled;
  e.error.clear();
  e.enqueued_at = now;
  e.started_at = started ? now : 0;
  e.completed_at = 0;
  e.timeout_ms = (op.timeout.count() >= 0 ? op.timeout : g.timeout).count();
  return handle;
}

void FlightRecorder::record_started(const TraceHandle& handle) {
  if (!handle) return;
  const int64_t now = clock_.now();
  std::lock_guard lock(lock_);
  TraceGroup& g = *handle.group;
  uint64_t& last = handle.p2p ? g.last_started_p2p : g.last_started;
  last = std::max(last, handle.seq);
  if (Entry* e = find(handle.id); e != nullptr && e->state == State::kScheduled) {
    e->state = State::kStarted;
    e->started_at = now;
  }
}

void FlightRecorder::record_finished(const TraceHandle& handle, std::exception_ptr error) {
  if (!handle) return;
  const int64_t now = clock_.now();
  std::string message;
  bool worth_a_dump = false;
  if (error) std::tie(message, worth_a_dump) = classify(error);
  std::string reason;
  {
    std::lock_guard lock(lock_);
    TraceGroup& g = *handle.group;
    uint64_t& last = handle.p2p ? g.last_completed_p2p : g.last_completed;
    last = std::max(last, handle.seq);
    --g.in_flight;
    --in_flight_;
    Entry* e = find(handle.id);
    if (e != nullptr) {
      e->state = error ? State::kFailed : State::kCompleted;
      e->completed_at = now;
      if (e->started_at == 0) e->started_at = now;
      if (error) e->error = message;
    }
    worth_a_dump = worth_a_dump && !g.closing && !auto_dumped_.load();
    if (worth_a_dump) {
      reason = core::detail::str_cat("rank ", dump_rank_locked(), ": ",
                                     e ? trace_op_name(e->op) : std::string("operation"),
                                     handle.p2p ? " p2p seq " : " seq ", handle.seq, " on group '",
                                     g.name, "' failed: ", message);
    }
  }
  if (worth_a_dump) auto_dump(reason);
}

bool FlightRecorder::auto_dump(const std::string& reason, bool publish) {
  if (auto_dumped_.exchange(true)) return false;
  core::before_blocking();  // files and stores: a caller holding the GIL lets go of it first
  try {
    dump_to_file(reason);
  } catch (const std::exception& e) {
    core::log(core::LogLevel::kError,
              std::string("flight recorder: could not write the trace: ") + e.what());
  }
  if (publish) {
    // Tell the others why, before the counter moves, so a watcher that sees the counter finds
    // the reason.
    std::vector<std::shared_ptr<store::Store>> stores;
    {
      std::lock_guard lock(lock_);
      for (const auto& weak : groups_) {
        auto g = weak.lock();
        if (!g) continue;
        if (auto s = g->store.lock()) stores.push_back(std::move(s));
      }
    }
    for (auto& s : stores) {
      try {
        s->set(kDumpReasonKey, store::to_bytes(reason));
      } catch (...) {
      }
    }
    publish_dump_request();
  }
  return true;
}

void FlightRecorder::publish_dump_request() {
  std::vector<std::pair<std::shared_ptr<TraceGroup>, std::shared_ptr<store::Store>>> targets;
  {
    std::lock_guard lock(lock_);
    for (const auto& weak : groups_) {
      auto g = weak.lock();
      if (!g) continue;
      if (auto s = g->store.lock()) targets.emplace_back(std::move(g), std::move(s));
    }
  }
  for (auto& [group, s] : targets) {
    try {
      const int64_t count = s->add(kDumpRequestKey, 1);
      std::lock_guard lock(lock_);
      group->dump_requests_seen = std::max(group->dump_requests_seen, count);
    } catch (...) {
      // A dead store is likely part of the failure being reported; the local dump stands.
    }
  }
}

void FlightRecorder::poll_dump_requests() {
  if (auto_dumped_.load()) return;
  std::vector<std::pair<std::shared_ptr<TraceGroup>, std::shared_ptr<store::Store>>> targets;
  const int64_t now = core::now_ns();
  {
    std::lock_guard lock(lock_);
    if (in_flight_ <= 0) return;
    for (const auto& weak : groups_) {
      auto g = weak.lock();
      if (!g || g->in_flight <= 0 || g->closing || g->poll_paused_until_ns > now) continue;
      if (auto s = g->store.lock()) targets.emplace_back(std::move(g), std::move(s));
    }
  }
  for (auto& [group, s] : targets) {
    std::string reason;
    try {
      if (!s->check({kDumpRequestKey})) continue;
      const int64_t count = s->add(kDumpRequestKey, 0);
      {
        std::lock_guard lock(lock_);
        if (count <= group->dump_requests_seen) continue;
        group->dump_requests_seen = count;
        reason = "requested through the store of group '" + group->name + "'";
      }
      if (s->check({kDumpReasonKey})) {
        reason += " after " + store::to_string(s->get(kDumpReasonKey));
      }
    } catch (...) {
      std::lock_guard lock(lock_);
      group->poll_paused_until_ns = core::now_ns() + kStorePollPauseNs;
      if (reason.empty()) continue;
    }
    auto_dump(reason, /*publish=*/false);
    return;
  }
}

void FlightRecorder::start_watcher() {
  std::lock_guard lock(watcher_mutex_);
  if (watcher_.joinable()) return;
  watcher_ = std::thread([this] { watch(); });
  if (process_recorder_) watcher_.detach();  // the process recorder lives until exit
}

void FlightRecorder::watch() {
  std::unique_lock lock(watcher_mutex_);
  while (!watcher_stop_) {
    watcher_cv_.wait_for(lock, kWatchInterval);
    if (watcher_stop_) break;
    lock.unlock();
    if (g_signal_pending.exchange(false)) {
      try {
        dump_to_file("signal SIGUSR1");
      } catch (const std::exception& e) {
        core::log(core::LogLevel::kError,
                  std::string("flight recorder: could not write the trace: ") + e.what());
      }
    }
    try {
      poll_dump_requests();
    } catch (...) {
    }
    lock.lock();
  }
}

int FlightRecorder::dump_rank_locked() const {
  for (const auto& weak : groups_) {
    auto g = weak.lock();
    if (!g) continue;
    if (g->global_ranks && g->rank < static_cast<int>(g->global_ranks->size())) {
      return (*g->global_ranks)[g->rank];
    }
    return g->rank;
  }
  try {
    if (core::env_is_set(core::kEnvRank)) return static_cast<int>(core::env_int(core::kEnvRank));
  } catch (...) {
  }
  return -1;
}

int FlightRecorder::dump_rank() const {
  std::lock_guard lock(lock_);
  return dump_rank_locked();
}

std::string FlightRecorder::dump_json_locked(bool include_completed, bool only_active,
                                             const std::string& reason, int indent) const {
  json out;
  out["version"] = kFormatVersion;
  out["format"] = "c10d flight recorder";
  out["pid"] = static_cast<int64_t>(getpid());
  out["rank"] = dump_rank_locked();
  out["job"] = job_;
  out["hostname"] = hostname();
  out["timestamp_ns"] = wall_ns();
  out["reason"] = reason;
  out["buffer_size"] = capacity_;
  out["entries_recorded"] = next_id_ - 1;
  out["entries_kept"] = ring_.size();
  out["include_completed"] = include_completed;
  out["only_active"] = only_active;

  // Every live group, and every group an entry still names (by uid, in registration order).
  std::map<uint64_t, const TraceGroup*> groups;
  std::vector<std::shared_ptr<TraceGroup>> alive;
  for (const auto& weak : groups_) {
    if (auto g = weak.lock()) {
      groups[g->uid] = g.get();
      alive.push_back(std::move(g));
    }
  }
  for (const auto& e : ring_) {
    if (e.group) groups[e.group->uid] = e.group.get();
  }
  json group_list = json::array();
  for (const auto& [uid, g] : groups) {
    json j;
    j["name"] = g->name;
    j["uid"] = uid;
    j["desc"] = g->desc;
    j["backend"] = g->backend;
    j["rank"] = g->rank;
    j["size"] = g->size;
    j["ranks"] = g->global_ranks ? json(*g->global_ranks) : json(nullptr);
    j["timeout_ms"] = g->timeout.count();
    j["in_flight"] = g->in_flight;
    j["last_enqueued_seq"] = g->last_enqueued;
    j["last_started_seq"] = g->last_started;
    j["last_completed_seq"] = g->last_completed;
    j["last_enqueued_p2p_seq"] = g->last_enqueued_p2p;
    j["last_started_p2p_seq"] = g->last_started_p2p;
    j["last_completed_p2p_seq"] = g->last_completed_p2p;
    group_list.push_back(std::move(j));
  }
  out["groups"] = std::move(group_list);

  json entries = json::array();
  const TraceClock::Scale to_ns = clock_.scale();
  const size_t n = ring_.size();
  const size_t oldest = n < capacity_ || n == 0 ? 0 : (next_id_ - 1) % capacity_;
  for (size_t i = 0; i < n; ++i) {
    const Entry& e = ring_[(oldest + i) % n];
    const bool active = e.state == State::kScheduled || e.state == State::kStarted;
    if (only_active && !active) continue;
    if (!include_completed && e.state == State::kCompleted) continue;
    json j;
    j["id"] = e.id;
    j["group"] = e.group->name;
    j["group_uid"] = e.group->uid;
    j["op"] = trace_op_name(e.op);
    j["p2p"] = e.p2p;
    j["seq"] = e.seq;
    j["pg_seq"] = e.pg_seq;
    if (e.p2p) {
      j["peer"] = e.peer >= 0 ? json(e.peer) : json(nullptr);
      const auto& ranks = e.group->global_ranks;
      j["peer_global"] = (e.peer >= 0 && ranks && e.peer < static_cast<int>(ranks->size()))
                             ? json((*ranks)[e.peer])
                             : json(nullptr);
    }
    j["input_sizes"] = sizes_json(e.input_dims, e.input_sizes);
    j["input_dtypes"] = dtypes_json(e.input_dtypes);
    j["output_sizes"] =
        e.outputs_are_inputs ? j["input_sizes"] : sizes_json(e.output_dims, e.output_sizes);
    j["output_dtypes"] = e.outputs_are_inputs ? j["input_dtypes"] : dtypes_json(e.output_dtypes);
    j["state"] = trace_state_name(e.state);
    j["error"] = e.state == State::kFailed ? json(e.error) : json(nullptr);
    const int64_t started = to_ns(e.started_at);
    const int64_t completed = to_ns(e.completed_at);
    j["time_enqueued_ns"] = to_ns(e.enqueued_at);
    j["time_started_ns"] = time_or_null(started);
    j["time_completed_ns"] = time_or_null(completed);
    j["duration_ns"] = (completed != 0 && started != 0) ? json(completed - started) : json(nullptr);
    j["timeout_ms"] = e.timeout_ms;
    entries.push_back(std::move(j));
  }
  out["entries"] = std::move(entries);
  return out.dump(indent, ' ', false, json::error_handler_t::replace);
}

std::string FlightRecorder::dump_trace_json(bool include_completed, bool only_active) const {
  std::lock_guard lock(lock_);
  return dump_json_locked(include_completed, only_active, "on demand", -1);
}

void FlightRecorder::set_job(const std::string& job) {
  std::string kept;
  for (char c : job) {
    if (kept.size() == 64) break;
    const bool plain =
        std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
    kept += plain ? c : '-';
  }
  std::lock_guard lock(lock_);
  job_ = std::move(kept);
}

std::string FlightRecorder::job() const {
  std::lock_guard lock(lock_);
  return job_;
}

std::string FlightRecorder::dump_to_file(const std::string& reason) const {
  std::string text;
  int rank;
  std::string job;
  {
    std::lock_guard lock(lock_);
    rank = dump_rank_locked();
    job = job_;
    text = dump_json_locked(/*include_completed=*/true, /*only_active=*/false, reason, 1);
  }
  namespace fs = std::filesystem;
  const fs::path dir = core::env_string(core::kEnvTraceDumpDir);
  const std::string name =
      "c10d_trace_" + (job.empty() ? "" : job + "_") +
      (rank >= 0 ? "rank" + std::to_string(rank) : "pid" + std::to_string(getpid())) + ".json";
  const fs::path path = dir / name;
  const fs::path tmp = dir / (name + ".tmp" + std::to_string(getpid()));
  std::error_code ec;
  fs::create_directories(dir, ec);
  {
    std::ofstream file(tmp, std::ios::binary | std::ios::trunc);
    file << text << '\n';
    file.close();
    C10D_CHECK(file.good(), "flight recorder: cannot write ", tmp.string(), " (",
               core::kEnvTraceDumpDir.name, "=", dir.string(), ")");
  }
  fs::rename(tmp, path, ec);
  C10D_CHECK(!ec, "flight recorder: cannot rename ", tmp.string(), " to ", path.string(), ": ",
             ec.message());
  core::log(core::LogLevel::kWarning,
            "flight recorder: wrote " + path.string() + " (" + reason + ")");
  return path.string();
}

}  // namespace c10d::pg
