// StepChannel: the step protocol, waits, signature and mismatch checks, failure diagnosis,
// placement watching and calibration (see step_channel.h).
#include "c10d/backends/shm/step_channel.h"

#include <sched.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "c10d/core/blocking.h"
#include "c10d/core/clock.h"
#include "c10d/core/env.h"
#include "c10d/pg/backend.h"

namespace c10d::backends::shm {

using core::DistBackendError;
using core::DistTimeoutError;
using core::DType;
using core::now_ns;
using core::OpType;
using core::ReduceOp;
using core::detail::str_cat;
using detail::cpu_relax;
using detail::futex_wait;
using detail::kCalibrationBytes;
using detail::kCalibrationRounds;
using detail::kCalibrationRuns;
using detail::kCheckNs;
using detail::kMailboxSpins;
using detail::kModeLargeChunks;
using detail::kModeStreaming;
using detail::kPlacementGiveUpNs;
using detail::kPlacementPeriodNs;
using detail::kPlacementTrips;
using detail::kSleepNs;
using detail::post;
using detail::prefetch_for_write;
using detail::reached;
using pg::Millis;

namespace {

// How many ranks share a core: the ranks spread over the CPUs they may run on together. With
// more ranks than CPUs the algorithms change (see tuning.h), so the count must be the same on
// every rank: Segment::cpus is.
size_t ranks_per_core(const Segment& seg) {
  return detail::ceil_div(static_cast<size_t>(seg.size()), static_cast<size_t>(seg.cpus()));
}

// The modes rank 0 chose in earlier calibrations, by the processes (pids, in rank order) and
// the modes they tried.
struct RememberedModes {
  std::mutex mutex;
  std::map<std::pair<std::vector<int>, std::vector<int>>, int> chosen;  // guarded by mutex
};

RememberedModes& remembered() {
  static auto* modes = new RememberedModes;  // never destroyed: groups may outlive statics
  return *modes;
}

}  // namespace

std::optional<int> StepChannel::remembered_mode(const std::vector<int>& members,
                                                const std::vector<int>& modes) {
  RememberedModes& r = remembered();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.chosen.find({members, modes});
  if (it == r.chosen.end()) return std::nullopt;
  return it->second;
}

void StepChannel::remember_mode(const std::vector<int>& members, const std::vector<int>& modes,
                                int mode) {
  RememberedModes& r = remembered();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.chosen[{members, modes}] = mode;
}

StepChannel::StepChannel(std::shared_ptr<Segment> segment, bool pinned)
    : segment_(std::move(segment)), seg_(*segment_), rank_(seg_.rank()), size_(seg_.size()),
      per_core_(ranks_per_core(seg_)), policy_(detail::wait_policy(per_core_)),
      own_core_(per_core_ <= 1), direct_piece_(detail::direct_piece(per_core_)),
      direct_allreduce_(own_core_ ? detail::kDirectAllreduceBytes
                                  : detail::kDirectAllreduceSharedCoreBytes),
      small_chunk_(own_core_ ? detail::kPipelineChunk : detail::shared_core_chunk(per_core_)),
      far_trip_ns_(core::env_int(core::kEnvShmFarTripNs)),
      copy_shared_(/*may_adapt=*/true, /*leader=*/rank_ == 0, /*choose_chunks=*/own_core_),
      cpu_group_(pinned && !own_core_ ? rank_ % seg_.cpus() : -1) {
  // The slots take a few operations after the in-place path to run at their pace again.
  ModeProbe::Config path_config;
  path_config.settle_ops = 4;
  path_probes_.fill(ModeProbe(path_config));
}

void StepChannel::begin(const char* name, OpType type, uint64_t seq, Millis timeout) {
  name_ = name;
  seq_ = seq;
  described_ = pg::Signature{};
  described_.seq = seq;
  described_.kind = static_cast<uint8_t>(type);
  op_ = signature(described_);
  timeout_ = timeout;
  deadline_started_ = false;  // see await_step
  if (!broken_.empty()) {
    throw DistBackendError(
        str_cat(describe(), ": the backend is unusable after an earlier failure: ", broken_));
  }
  if (aborted_.load()) throw DistBackendError(str_cat(describe(), ": the backend was shut down"));
  copy_shared_.begin_op(type);
}

std::string StepChannel::describe() const {
  return str_cat("shm ", name_, " (sequence ", seq_, ", rank ", rank_, " of ", size_, ")");
}

void StepChannel::calibrate(Millis timeout, const std::function<void(bool)>& allreduce) {
  std::vector<int> modes;  // kModeStreaming, kModeLargeChunks
  for (int mode = 0; mode < 4; ++mode) {
    if ((mode & kModeStreaming) != 0 && !copy_shared_.adaptive()) continue;
    if ((mode & kModeLargeChunks) != 0 && !own_core_) continue;
    modes.push_back(mode);
  }
  if (size_ < 2 || modes.size() < 2) return;
  begin("chunk calibration", OpType::kAllreduce, 0, timeout);
  // The placement that decides it lasts as long as the processes: a group of processes that
  // calibrated together before (rank 0 remembers) takes that verdict at once, so creating
  // subgroups again and again costs no timing.
  std::vector<int> members(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) members[static_cast<size_t>(r)] = seg_.pid(r);
  const uint32_t asked = next_step();
  if (rank_ == 0) {
    const std::optional<int> known = remembered_mode(members, modes);
    rank0_word(asked) = known ? kRememberedBit | static_cast<uint64_t>(*known) : 0;
  }
  sync(asked);
  if (const uint64_t word = rank0_word(asked); (word & kRememberedBit) != 0) {
    adopt_mode(static_cast<int>(word & ~kRememberedBit));
    return;
  }
  const bool stores = copy_shared_.streaming();  // as C10D_SHM_STREAM fixed them, if it did
  std::vector<int64_t> best(modes.size(), INT64_MAX);
  // Ranks sharing cores time 16 allreduces in all: more would slow initialisation (see
  // docs/design/shm.md#calibration).
  const size_t rounds = own_core_ ? kCalibrationRounds : 16 / modes.size() / 2;
  const int runs = own_core_ ? kCalibrationRuns : 2;
  for (size_t i = 0; i < modes.size() * rounds; ++i) {
    const int mode = modes[i % modes.size()];
    if (copy_shared_.adaptive()) copy_shared_.use_streaming((mode & kModeStreaming) != 0);
    for (int run = 0; run < runs; ++run) {
      const int64_t start = now_ns();
      allreduce((mode & kModeLargeChunks) != 0);
      int64_t& b = best[i % modes.size()];
      if (run > 0) b = std::min(b, now_ns() - start);
    }
  }
  copy_shared_.use_streaming(stores);
  // Rank 0's timings decide for every rank.
  const uint32_t s = next_step();
  if (rank_ == 0) {
    const int mode = modes[std::min_element(best.begin(), best.end()) - best.begin()];
    rank0_word(s) = static_cast<uint64_t>(mode);
    seg_.header(0)->placement.store((mode & kModeStreaming) != 0 ? kFarBit : 0,
                                    std::memory_order_relaxed);
  }
  sync(s);
  if (rank_ == 0) remember_mode(members, modes, static_cast<int>(rank0_word(s)));
  adopt_mode(static_cast<int>(rank0_word(s)));
  if (core::log_enabled(core::LogLevel::kDebug)) {
    std::string times;
    for (size_t m = 0; m < modes.size(); ++m) {
      times += str_cat(" mode ", modes[m], " ", best[m] / 1000, " us;");
    }
    core::log(core::LogLevel::kDebug,
              str_cat(describe(), ": calibration on cpu ", ::sched_getcpu(), ", allreduce of ",
                      kCalibrationBytes, " bytes (mode bit 0 streaming, bit 1 large chunks):",
                      times, " rank 0 chose ", agreed_mode_));
  }
}

void StepChannel::adopt_mode(int mode) {
  agreed_mode_ = mode;
  copy_shared_.seed((agreed_mode_ & kModeStreaming) != 0);
  // Streaming stores won calibration if the vCPUs were far apart (plain ones win otherwise);
  // from here the round trips tell.
  far_ = (agreed_mode_ & kModeStreaming) != 0;
  watching_ = seg_.cpus() >= 2 && copy_shared_.adaptive();
  next_placement_ns_ = now_ns() + kPlacementPeriodNs;
}

// ---------------------------------------------------------------------------------------------
// Steps

void StepChannel::publish(uint32_t s) {
  SegmentHeader* h = seg_.header(rank_);
  if (own_core_) note_cpu(h);
  h->step.op[s % kSignatureDepth].store(op_, std::memory_order_relaxed);
  post(h->step, s);  // releases the signature, and the description show_step wrote, with it
}

// Records the CPU this rank runs on in its header when it changed (for peer_on_my_cpu).
void StepChannel::note_cpu(SegmentHeader* h) {
  const int cpu = ::sched_getcpu();
  if (cpu == cpu_) return;
  cpu_ = cpu;
  h->cpu.store(cpu, std::memory_order_relaxed);
}

// Whether rank r last published a step from the CPU this thread runs on (tracked only while
// every rank has a core; otherwise waits barely spin anyway). Spinning for it then only
// keeps it from running: with two ranks on one CPU (taskset, or the scheduler packing them
// while another program runs) every wait spun its full 200 us before it yielded (see
// docs/design/shm.md#wait-policy).
bool StepChannel::peer_on_my_cpu(int r) const {
  return own_core_ && seg_.header(r)->cpu.load(std::memory_order_relaxed) == ::sched_getcpu();
}

// Opens the next step. A step that uses the parity slots (the default) waits until every
// peer published the previous step, so nobody still reads those slots from two steps ago.
// A `one_sided` one, whose readers finish reading before they publish it (broadcast,
// gather, scatter), needs only the step two back published when that step was one-sided
// too: then a writer fills chunk k + 1 while its readers still copy out chunk k.
// A `small` one uses only its ring entry (slot(r, s, true)), last used kRingDepth steps
// ago, so it waits only for peers that far behind: one-sided collectives run ahead. Every
// rank opens a given step with the same `small`.
//
// all_reached_ remembers the lowest step the peers were seen at, which can be well past
// `need`: a root running ahead through the ring then reads the peers' step words once per
// few operations, not once per operation (each read is a cache miss, as peers write them).
uint32_t StepChannel::next_step(bool small, bool one_sided) {
  const uint32_t s = step_ + 1;
  in_step_ = s;
  uint32_t need = s - 1;
  if (small) {
    need = s - (kRingDepth - 1);
  } else if (one_sided && (two_sided_ & 2) == 0) {
    need = s - 2;
  }
  two_sided_ = ((two_sided_ << 1) | (small || one_sided ? 0 : 1)) & 3;
  if (!reached(all_reached_, need)) {
    uint32_t lowest = s;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      const uint32_t seen = await_step(r, need);  // step `need` may be another operation's
      if (!reached(seen, lowest)) lowest = seen;
    }
    all_reached_ = lowest;
  }
  show_step();  // after the wait: peers no longer read the description entry it overwrites
  return s;
}

void StepChannel::sync(uint32_t s) {
  const bool time_trips = placement_due();
  if (time_trips) {  // published with the step
    std::atomic<uint64_t>& word = seg_.header(0)->placement;
    word.store((word.load(std::memory_order_relaxed) & ~kStepBits) | s, std::memory_order_relaxed);
  }
  publish(s);
  for (int r = 0; r < size_; ++r) {
    if (r != rank_) wait_peer(r, s);
  }
  step_ = s;
  all_reached_ = s;
  if (watching_) watch_placement(s, time_trips);
}

std::vector<int> StepChannel::not_arrived(uint32_t s) const {
  std::vector<int> missing;
  for (int r = 0; r < size_; ++r) {
    if (!reached(seg_.header(r)->step.value.load(std::memory_order_acquire), s)) {
      missing.push_back(r);
    }
  }
  return missing;
}

void StepChannel::sync_after_reads() {
  sync(next_step());
  // A peer that gave up marked it before its caller could touch the buffer: a mark missed
  // here was set after this rank's reads were done.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    // (A peer that shut down after finishing the operation had published its last step only
    // after its own reads, so `closed` alone says nothing.)
    if (seg_.header(r)->abandoned.load(std::memory_order_seq_cst) != 0) {
      fail<DistBackendError>(str_cat(describe(), ": rank ", r,
                                     " gave up on the operation while this rank read its "
                                     "buffer, so the result cannot be trusted"));
    }
  }
}

void StepChannel::finish_step(uint32_t s, bool last) {
  publish(s);
  step_ = s;
  for (int r = 0; last && r < size_; ++r) {
    if (r != rank_) await_arrival(r, s);
  }
  claim_next_mailbox();
}

// Until peer r opened step s of this operation (or published it); a peer not there within
// the spins is waited for until it published it (wait_peer: deadlines, dead peers, sleeping).
void StepChannel::await_arrival(int r, uint32_t s) {
  const SegmentHeader* h = seg_.header(r);
  for (int i = 0; i < kMailboxSpins * policy_.blind_spins; ++i) {
    if (reached(h->step.value.load(std::memory_order_acquire), s)) break;
    const uint64_t at = h->blocked.load(std::memory_order_acquire);
    if (at >> 32 == s) {
      if (static_cast<uint32_t>(at) == op_) return;
      fail_mismatch(r, peer_call(r, s, static_cast<uint32_t>(at)), "is in");
    }
    cpu_relax();
  }
  wait_peer(r, s);
}

// Waits until peer r published step s of this operation.
void StepChannel::wait_peer(int r, uint32_t s) {
  await_step(r, s);
  check_same_op(r, s);
}

// Waits until peer r published step s (of whatever operation); returns the step seen.
uint32_t StepChannel::await_step(int r, uint32_t s) {
  FutexWord& w = seg_.header(r)->step;
  uint32_t seen = w.value.load(std::memory_order_acquire);
  if (reached(seen, s)) return seen;
  // A clock read costs as much as a few dozen spins, and most waits of small operations end
  // sooner: look at the clock only after those (none when ranks outnumber cores: spinning
  // then only delays the rank being waited for). See docs/design/shm.md#wait-policy.
  for (int i = 0; i < policy_.blind_spins; ++i) {
    cpu_relax();
    if (reached(seen = w.value.load(std::memory_order_acquire), s)) return seen;
  }
  core::before_blocking();
  const int64_t start = now_ns();
  const bool spin = policy_.spin_ns > 0 && !peer_on_my_cpu(r);
  // The operation's deadline counts from its first wait that got this far, not from its
  // start: an operation that never waits needs no clock read for it. The difference is the
  // time the operation spent copying before it first waited.
  if (!deadline_started_) {
    const core::Clock::time_point started{std::chrono::nanoseconds(start)};  // CLOCK_MONOTONIC
    deadline_ = core::Deadline(timeout_, started);
    deadline_started_ = true;
  }
  for (uint32_t i = 1; spin; ++i) {
    cpu_relax();
    if (reached(seen = w.value.load(std::memory_order_acquire), s)) return seen;
    if ((i & 63) != 0) continue;
    if (now_ns() - start > policy_.spin_ns || peer_on_my_cpu(r)) break;
  }
  int64_t last_check = now_ns();
  for (;;) {
    ::sched_yield();
    if (reached(seen = w.value.load(std::memory_order_acquire), s)) return seen;
    const int64_t now = now_ns();
    if (now - start > policy_.yield_ns) break;
    if (now - last_check >= kCheckNs) {
      last_check = now;
      check_waiting(s);
    }
  }
  for (;;) {
    w.waiters.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t v = w.value.load(std::memory_order_seq_cst);
    if (!reached(v, s)) futex_wait(&w.value, v, kSleepNs);
    w.waiters.fetch_sub(1, std::memory_order_relaxed);
    if (reached(seen = w.value.load(std::memory_order_acquire), s)) return seen;
    const int64_t now = now_ns();
    if (now - last_check >= kCheckNs) {
      last_check = now;
      check_waiting(s);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Mailboxes

// After a step in which this rank wrote its mailbox: asks for the lines the next step would
// write with as many bytes in a writable state (PREFETCHW). The peers hold them from reading
// step s + 1 - kRingDepth, and without the claim the next write would wait for every peer's
// copy to be invalidated, a round trip between the CPUs, in publish()'s fence; claimed here,
// that happens while this rank runs its caller's code. After the step, not at the seal: the
// claims would slow the peers' reads of this step (see
// docs/design/shm.md#one-sided-steps-and-mailboxes).
void StepChannel::claim_next_mailbox() {
  if (sealed_bytes_ == 0) return;
  const auto* next =
      reinterpret_cast<const char*>(&seg_.header(rank_)->mailbox[(sealed_step_ + 1) % kRingDepth]);
  const size_t used = offsetof(Mailbox, data) + sealed_bytes_;
  for (size_t at = 0; at < used; at += kLine) prefetch_for_write(next + at);
  sealed_bytes_ = 0;
}

// Until peer r's mailbox holds step s of this operation.
void StepChannel::await_mailbox(int r, uint32_t s) {
  const Mailbox& box = seg_.header(r)->mailbox[s % kRingDepth];
  for (int i = 0; i < kMailboxSpins * policy_.blind_spins; ++i) {
    if (box.step.load(std::memory_order_acquire) == s) {
      if (box.op.load(std::memory_order_relaxed) == op_) return;
      break;  // another operation: wait_peer names both
    }
    cpu_relax();
  }
  wait_peer(r, s);
}

// ---------------------------------------------------------------------------------------------
// Signatures: what every rank must run at each step

// The shape every rank must give the collective about to run (count in elements of dtype,
// or in bytes without one); it becomes part of every step's signature.
void StepChannel::expect(size_t count, std::optional<DType> dtype, int root,
                         std::optional<ReduceOp::Kind> reduce) {
  described_.count = count;
  described_.dtype = dtype ? static_cast<uint8_t>(*dtype) : pg::Signature::kNone;
  described_.root = root;
  described_.reduce = reduce ? static_cast<uint8_t>(*reduce) : pg::Signature::kNone;
  op_ = signature(described_);
  copy_shared_.select(dtype ? count * core::element_size(*dtype) : count, agreed_mode_);
}

// The same for a collective that moves `bytes` of `dtype` without computing on them: the
// dtype is checked too, although only the bytes matter here (a float32 tensor on one rank and
// an int32 one on another would be reinterpreted otherwise).
void StepChannel::expect_moved(size_t bytes, DType dtype, int root) {
  expect(bytes / core::element_size(dtype), dtype, root);
}

// 32 bits for the step word: the OpType and a 24-bit hash of everything else.
uint32_t StepChannel::signature(const pg::Signature& d) {
  uint64_t h = d.seq * 0x9e3779b97f4a7c15ULL;
  h ^= (d.count + 0x632be59bd9b4e019ULL) * 0xbf58476d1ce4e5b9ULL;
  h ^= (static_cast<uint64_t>(static_cast<uint32_t>(d.root)) << 16 |
        static_cast<uint64_t>(d.dtype) << 8 | d.reduce) *
       0x94d049bb133111ebULL;
  h ^= h >> 31;
  h *= 0xd6e8feb86659fd93ULL;
  h ^= h >> 32;
  return static_cast<uint32_t>(h << 8) | d.kind;
}

std::string StepChannel::shape_text(const pg::Signature& d) {
  std::string text =
      d.dtype == pg::Signature::kNone
          ? str_cat(d.count, " bytes")
          : str_cat(d.count, " elements of ", core::dtype_name(static_cast<DType>(d.dtype)));
  if (d.root >= 0) text += str_cat(", root ", d.root);
  if (d.reduce != pg::Signature::kNone) {
    text += str_cat(", ", ReduceOp(static_cast<ReduceOp::Kind>(d.reduce)).name());
  }
  return text;
}

std::string StepChannel::description_text(const pg::Signature& d) {
  return str_cat(core::op_type_name(static_cast<OpType>(d.kind)), " (sequence ", d.seq, ") on ",
                 shape_text(d));
}

// Fails unless peer r ran this rank's operation, with its shape, at step s.
void StepChannel::check_same_op(int r, uint32_t s) {
  const SegmentHeader* h = seg_.header(r);
  if (h->step.op[s % kSignatureDepth].load(std::memory_order_relaxed) == op_) return;
  const pg::Signature theirs = h->described[s % kRingDepth];
  if (theirs == described_) return;
  fail_mismatch(r, description_text(theirs), "runs");
}

// What rank r runs at step s, which it showed with signature `sig` (show_step): in full when
// its description of the step is there, else the kind (a rank that waited in next_step
// showed the step before it described it).
std::string StepChannel::peer_call(int r, uint32_t s, uint32_t sig) const {
  const pg::Signature d = seg_.header(r)->described[s % kRingDepth];
  if (signature(d) == sig) return description_text(d);
  return str_cat(core::op_type_name(static_cast<OpType>(static_cast<uint8_t>(sig))),
                 " (another collective, or one with other sizes, dtypes, roots or reductions)");
}

// Rank r is at this step (`verb`: "runs", "is in") in `theirs`, another operation than ours.
void StepChannel::fail_mismatch(int r, const std::string& theirs, const char* verb) {
  fail<DistBackendError>(str_cat(describe(), ": rank ", r, " ", verb, " ", theirs,
                                 " at this step while this rank runs ",
                                 description_text(described_),
                                 "; every rank must issue the same collectives in the same "
                                 "order, with the same sizes, dtypes, roots and reductions"));
}

// ---------------------------------------------------------------------------------------------
// Failure diagnosis

// Where this rank stands, for peers that wait for it: the step it opened and its operation,
// in `blocked` (step high, signature low), and in full in its description of that step.
void StepChannel::show_step() {
  SegmentHeader* h = seg_.header(rank_);
  h->described[in_step_ % kRingDepth] = described_;
  h->blocked.store(uint64_t{in_step_} << 32 | op_, std::memory_order_release);
}

// Fails if one of the ranks this one waits for is in the same step in another operation
// (show_step), blocked or given up: then neither can go on (e.g. both are the root of a
// gather, each waiting for the other's data), and only the timeout would end it. Ranks that did
// issue the same operation never differ here: a step belongs to one operation on every rank.
void StepChannel::check_not_waiting_for_each_other(const std::vector<int>& missing) {
  const uint64_t mine = uint64_t{in_step_} << 32 | op_;
  std::atomic<uint64_t>& blocked = seg_.header(rank_)->blocked;
  if (blocked.load(std::memory_order_relaxed) != mine) {
    blocked.store(mine, std::memory_order_release);  // waiting in next_step: not shown yet
  }
  for (int r : missing) {
    if (r == rank_) continue;
    const uint64_t theirs = seg_.header(r)->blocked.load(std::memory_order_acquire);
    if (theirs >> 32 != in_step_ || theirs == mine) continue;
    fail_mismatch(r, peer_call(r, in_step_, static_cast<uint32_t>(theirs)), "is in");
  }
}

// Throws (and marks the channel broken) when the wait for step s cannot succeed.
void StepChannel::check_waiting(uint32_t s) {
  if (aborted_.load()) fail<DistBackendError>(str_cat(describe(), ": the backend was shut down"));
  const std::vector<int> missing = not_arrived(s);
  // First: a peer that failed on the mismatch has shut down by now.
  check_not_waiting_for_each_other(missing);
  for (int r : missing) {
    if (r == rank_) continue;
    const std::string gone = seg_.peer_gone(r);
    if (!gone.empty()) {
      fail<DistBackendError>(
          str_cat(describe(), ": rank ", r, " ", gone, " while this rank waited for it"));
    }
  }
  if (deadline_.expired()) {
    std::vector<int> peers;
    for (int r : missing) {
      if (r != rank_) peers.push_back(r);
    }
    // "Timed out" between spaces, as torch's messages have it (its tests match on that).
    fail<DistTimeoutError>(str_cat(describe(), ": Timed out after ", core::format_timeout(timeout_),
                                   " waiting for rank", peers.size() == 1 ? " " : "s ",
                                   pg::join_ranks(peers)));
  }
}

// ---------------------------------------------------------------------------------------------
// Placement

// The host moves the vCPUs between placements every few minutes, and in the slow one plain
// stores into lines a peer reads cost several times what they cost in the fast one (see
// SharedWriter). The probes of each kind of operation notice only after it ran for a while,
// so rank 0 also times a cache line's round trip with rank 1 after a two-sided step every
// kPlacementPeriodNs (a few microseconds), and tells every rank through its placement word
// whether the vCPUs are far apart (SharedWriter::placement_changed). Ranks that share
// cores are pinned to CPUs in turn (Segment::bind_cpu), so ranks 0 and 1 run on different
// ones, but rank 1 may not be running to answer, and a timing it does not answer costs rank
// 0 kPlacementGiveUpNs (see docs/design/shm.md#streaming-stores-and-placement).
bool StepChannel::placement_due() {
  if (!watching_ || rank_ != 0 || (++syncs_ & 15) != 0) return false;
  if (now_ns() < next_placement_ns_) return false;
  next_placement_ns_ = now_ns() + kPlacementPeriodNs;
  return !own_core_ || seg_.header(1)->cpu.load(std::memory_order_relaxed) != cpu_;
}

// After two-sided step s: rank 0 times the round trips if it asked for them (`time_trips`),
// rank 1 answers when asked, and every rank follows rank 0's verdict.
void StepChannel::watch_placement(uint32_t s, bool time_trips) {
  std::atomic<uint64_t>& word = seg_.header(0)->placement;
  const uint64_t seen = word.load(std::memory_order_acquire);
  if (rank_ != 0) {
    if (rank_ == 1 && (seen & kStepBits) == s) round_trip(s, 0, false);
    return set_placement((seen & kFarBit) != 0);
  }
  if (!time_trips) return;
  const int64_t trip = round_trip(s, 1, true);
  if (trip < 0) return;  // rank 1 did not answer in time: next period
  const bool far = trip >= far_trip_ns_;
  word.store((seen & kStepBits) | kTimedBit | (far ? kFarBit : 0), std::memory_order_release);
  set_placement(far);
}

// Bounces this rank's ping word off `peer`'s kPlacementTrips times (the leading side
// writes first); returns the median trip in ns, or -1 when the peer did not answer within
// kPlacementGiveUpNs.
int64_t StepChannel::round_trip(uint32_t s, int peer, bool leading) {
  std::atomic<uint64_t>& mine = seg_.header(rank_)->ping;
  const std::atomic<uint64_t>& theirs = seg_.header(peer)->ping;
  std::array<int64_t, kPlacementTrips> trips{};
  const int64_t start = now_ns();
  int64_t last = start;
  for (int i = 0; i < kPlacementTrips; ++i) {
    const uint64_t v = uint64_t{s} << 8 | static_cast<uint64_t>(i);
    if (leading) mine.store(v, std::memory_order_release);
    for (uint32_t spin = 1; theirs.load(std::memory_order_acquire) != v; ++spin) {
      cpu_relax();
      if ((spin & 63) == 0 && now_ns() - start > kPlacementGiveUpNs) return -1;
    }
    if (!leading) mine.store(v, std::memory_order_release);
    const int64_t now = now_ns();
    trips[i] = now - last;
    last = now;
  }
  // The first trip includes the wait for the other side to arrive.
  const auto mid = trips.begin() + 1 + (kPlacementTrips - 1) / 2;
  std::nth_element(trips.begin() + 1, mid, trips.end());
  return *mid;
}

void StepChannel::set_placement(bool far) {
  if (far == far_) return;
  far_ = far;
  copy_shared_.placement_changed(far);
  if (core::log_enabled(core::LogLevel::kDebug)) {
    core::log(
        core::LogLevel::kDebug,
        str_cat(describe(), ": the vCPUs are ", far ? "far apart" : "close",
                " now; the copies into shared lines use ", far ? "streaming" : "plain", " stores"));
  }
}

}  // namespace c10d::backends::shm
