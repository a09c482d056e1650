#include "c10d/backends/shm/shm_backend.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <climits>
#include <cstring>
#include <numeric>
#include <optional>
#include <utility>

#include "c10d/backends/shm/alias.h"
#include "c10d/backends/shm/mode_probe.h"
#include "c10d/backends/shm/segment.h"
#include "c10d/core/blocking.h"
#include "c10d/core/copy.h"
#include "c10d/core/env.h"
#include "c10d/core/exception.h"
#include "c10d/core/reduce.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace c10d::backends::shm {

using core::DistBackendError;
using core::DistTimeoutError;
using core::DType;
using core::OpType;
using core::ReduceOp;
using core::Tensor;
using core::detail::str_cat;
using pg::Millis;
using pg::WorkPtr;
using pg::wants_async;

namespace {

// Up to this many bytes an allreduce copies in once and every rank reduces every slot.
constexpr size_t kOneShotBytes = size_t{32} << 10;
// Owner-computes on shared-heap tensors works in pieces this large, so the reduced piece is
// still in cache when it is copied to the peers.
constexpr size_t kZeroCopyPiece = size_t{64} << 10;
// From this size on (a scatter's part, an alltoall's largest part), and when the kernel allows
// it (Segment::cma), scatter and alltoall copy straight between the ranks' own memory instead
// of through the slots: one copy per byte instead of two, but every call pins the pages. On an
// AMD EPYC Zen 5 guest (1 MiB L2 per core, 32 MiB L3) the slots win up to a few MiB. Min of 7
// timings, 2 runs each, slots against direct: 2 ranks, scatter of 1 MiB 57 us against 79, 4 MiB 250 against
// 212; alltoall of 1 MiB 32 against 57, 8 MiB 366-372 against 204-407; 4 ranks on 2 cores,
// scatter of 256 KiB 43-48 against 53-58, 4 MiB 887-908 against 616-775.
constexpr size_t kDirectBytes = size_t{4} << 20;
// Allreduce streams through the slots in cache-sized chunks, which beats the direct path up to
// tens of MiB while every rank has a core; past that the direct path's smaller memory traffic
// wins. Slots against direct, 2 ranks (min of 7 timings, 2 runs): 8 MiB 337 us against
// 422-553, 16 MiB 823-840 against 1149-1551, 32 MiB 2.21-2.23 ms against 2.58-2.90, 64 MiB
// 5.20-5.33 against 5.49-5.82 (even, so direct from there). With more ranks than cores, and
// the ranks pinned (Segment::bind_cpu), the slots win up to 64 MiB too: 4 ranks on 2 cores,
// medians of 8-12 timings, 3 launches each: 16 MiB 4.4-5.1 ms against 5.2-5.6, 32 MiB
// 9.0-9.1 against 9.8-9.9, 64 MiB 17.5-17.7 against 18.7-20.2; 128 MiB 46-48 against 35-38.
// (Unpinned, the direct path had won from 8 MiB: 32 MiB 6.3-8.4 ms against 5.7-7.0.)
constexpr size_t kDirectAllreduceBytes = size_t{64} << 20;
// While the host keeps the vCPUs far apart (Engine::watch_placement) every line a peer wrote
// into the slots crosses between core complexes, and the direct path, which moves each byte
// once, wins from a smaller size. Zen 5 guest, far apart (500-680 ns round trips), 2 ranks,
// medians of 8 timings, slots against direct, 4 launches alternating: 16 MiB 1073-1111 us
// against 881-1026; 8 MiB 506-532 against 484-572 and 32 MiB 2.81-3.07 ms against 2.88-2.90
// (even); 4 MiB 273-279 against 364-369. 4 ranks on 2 cores, far apart, 2 launches each:
// 16 MiB 4.69-5.25 ms against 4.10-4.70, 32 MiB 9.78-10.16 against 8.52-9.19, 4 MiB 1.05 against
// 1.08-1.30.
constexpr size_t kDirectAllreduceFarBytes = size_t{16} << 20;
constexpr size_t kDirectAllreduceSharedCoreBytes = size_t{96} << 20;
// The pipelined allreduce's chunk: step k copies chunk k in and the reduced pieces of chunk
// k - 1 out, so with smaller chunks the copies of one step stay in L2 and overlap the peers'.
// Which size wins depends on the machine. On an EPYC Zen 5 guest, 2 ranks, 3 interleaved runs
// each: 512 KiB in 45-48 us with 256 KiB chunks against 71-103 with 1 MiB (one chunk), 1 MiB
// in 85-148 against 153-266, 2 MiB in 160-269 against 260-305; 128 KiB chunks were slower
// again. On a Zen 4 guest 1 MiB chunks (kSlotBytes) won: 1 MiB in 54-66 us against 102-117,
// 2 MiB 101 against 219, 32 MiB 3.9 ms against 5.1. So with a core per rank the ranks time
// both at init (Engine::calibrate) and start with the faster, and their probes try both again
// (SharedWriter::select). When ranks share cores the chunk is fixed (shared_core_chunk).
constexpr size_t kPipelineChunk = size_t{256} << 10;
// Engine::calibrate times this many allreduces of kCalibrationBytes per configuration at
// init: chunk size, and plain or streaming stores. Plain stores into the slots are fast or
// slow for a whole launch on this project's Zen 4 VMs (2 ranks, all_reduce of 1 MiB 0.06 or
// 0.57 ms, of 4 MiB 0.25 or 2.3; 7 launches in 16 were slow), while streaming stores took
// 0.10-0.16 ms (0.42-0.65) in either kind of launch. The probes would find that too, but only
// after a kind of operation ran for a while (SharedWriter::probe_config).
//
// Each round runs a configuration kCalibrationRuns times in a row and times all but the first,
// which pays for the switch from the previous configuration (where the lines of the slots
// were left). Timing every allreduce right after a switch misjudged the chunks: 2 ranks, EPYC
// guest, 2 MiB with large chunks measured 181-230 us against 186-205 with small ones, so small
// chunks were chosen in 2 launches of 12 (twice), while all_reduce of 1 MiB took 85-115 us
// with small chunks against 55-70 (once 98) with large ones in every kind of launch (20
// launches, chunks forced alternately). Without the switches, large chunks measure 101-119 us
// and small ones 198-213 (13 launches of 14; the other ran in the slow placement).
constexpr int kCalibrationRounds = 4;
constexpr int kCalibrationRuns = 3;
constexpr size_t kCalibrationBytes = size_t{2} << 20;
// Broadcast, gather and all_gather go direct only from this size (see Engine::direct_fanout).
constexpr size_t kDirectFanoutBytes = size_t{8} << 20;
// With a core per rank, broadcast, all_gather and alltoall also go direct for mid-sized
// messages (a rank's part), from kDirectMidBytes to below kDirectMidEndBytes (broadcast:
// kBroadcastMidEndBytes): two copies through the slots cost more there than one through the
// kernel plus its page pinning and a final wait. On an EPYC Zen 4 guest, 2 ranks, min of 7
// timings, 2-3 launches, slots against direct: all_gather of 128 KiB per rank 21-28 us
// against 18-20, alltoall of 256 KiB in all 22-33 against 17-20, broadcast of 256 KiB 25-33
// against 21-22 and of 512 KiB 47-65 against 41-50. Past that the slots win again
// (all_gather of 768 KiB per rank 65-71 against 106-130, alltoall of 1 MiB 46 against 74),
// and with more ranks than cores they win at every size (4 ranks, all_gather of 64 KiB per
// rank 48-51 against 74-101). Broadcast goes direct up to kDirectFanoutBytes: the root of a
// slot broadcast runs ahead, but its receivers take longer than one kernel copy (time until
// every rank is done, the benchmark's measure, 2 ranks, 6 launches: 1 MiB 130-143 us through
// the slots, 84-103 direct; 2 MiB 229-289 against 197-206), even when the direct launches
// met the slow placement and the slot launches did not.
constexpr size_t kDirectMidBytes = size_t{64} << 10;
constexpr size_t kDirectMidEndBytes = size_t{512} << 10;
constexpr size_t kBroadcastMidEndBytes = kDirectFanoutBytes;
static_assert(kPipelineChunk <= kSlotBytes);
// A direct allreduce moves pieces this large per system call: large enough that the calls and
// the kernel's page pinning are cheap per byte, small enough that the landing area and the
// piece being reduced stay in the L2 cache (16 MiB, 2 ranks: ~2.6 ms against ~2.9 with 2 MiB
// pieces, median of 24 timings each).
constexpr size_t kDirectPiece = size_t{512} << 10;
// The pipelined allreduce reduces a rank's piece and copies it to the peers in blocks this
// large, so that the copy reads the block from L1; copying the whole piece after reducing it
// read it back from L2 or L3. On an EPYC Zen 4 guest, all_reduce medians over 3 interleaved
// launches each, blocks against whole pieces: 2 ranks, 4 MiB 191-192 us against 198-202 and
// 16 MiB 1.11-1.17 ms against 1.20-1.25; 4 ranks on 2 cores, 1 MiB 168-169 against 175-186
// (4 and 16 MiB even). With streaming stores blocks were slower (2 ranks, 4 MiB 360 us against
// 326).
constexpr size_t kPublishBlock = size_t{16} << 10;
// Engine::watch_placement: how often rank 0 times a cache line's round trip with rank 1, how
// many trips it makes, how long either side waits for the other before it gives up, and the
// median trip from which the vCPUs count as far apart is C10D_SHM_FAR_TRIP_NS. On this
// project's EPYC guests a trip took 85-120 ns (about 40 at times) and 460-510 ns in the slow
// placement, where plain stores into the slots cost several times streaming ones.
constexpr int64_t kPlacementPeriodNs = 100'000'000;
constexpr int kPlacementTrips = 16;
constexpr int64_t kPlacementGiveUpNs = 50'000;
// How often a blocked wait checks the peers, the deadline and shutdown.
constexpr int64_t kCheckNs = 1'000'000;
constexpr int64_t kSleepNs = 2'000'000;
// Spins a wait makes before it first reads the clock (Engine::await_step), when every rank has
// a core of its own.
constexpr int kBlindSpins = 32;
// A wait for a peer's Mailbox spins this many times kBlindSpins on the mailbox's line before
// it waits on the step word (Engine::await_mailbox): a couple of microseconds, which covers
// the skew between ranks of most small operations.
constexpr int kMailboxSpins = 4;

int64_t now_ns() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// Asks for the cache line at `p` in a writable state ahead of a store (PREFETCHW; a no-op on
// x86 CPUs without it, whose decoders take that opcode as a NOP).
inline void prefetch_for_write(const void* p) {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("prefetchw %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p, 1, 3);
#endif
}

// Shared futexes (no FUTEX_PRIVATE_FLAG): the words live in memory mapped by several processes.
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, int64_t ns) {
  timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr,
            0);
}

// Sets the word (release) and wakes sleepers, if any.
void post(FutexWord& w, uint32_t value) {
  w.value.store(value, std::memory_order_seq_cst);
  if (w.waiters.load(std::memory_order_seq_cst) != 0) futex_wake_all(&w.value);
}

void ring(FutexWord& w) {
  w.value.fetch_add(1, std::memory_order_seq_cst);
  if (w.waiters.load(std::memory_order_seq_cst) != 0) futex_wake_all(&w.value);
}

// Wrap-around safe "a >= b" for step numbers.
inline bool reached(uint32_t value, uint32_t target) {
  return static_cast<int32_t>(value - target) >= 0;
}

// How a blocked rank waits: it spins (cheapest wake-up while every rank has a core), then
// yields the core in a loop (a rank sharing the core, or a busy machine, gets to run while we
// stay runnable), and only then sleeps on the futex. When ranks outnumber cores spinning only
// steals time from the rank being waited for, so there is no spin phase: a perf profile of
// 4 ranks on 2 cores spent 31% of all cycles in a 500 ns spin, and all_reduce of 4 B took
// 6.2-6.4 us with it, 5.6 without (3 ranks: 5.2 against 3.3 us; 8 ranks: 17 against 13.5).
struct WaitPolicy {
  int blind_spins;  // spins before the first clock read (Engine::await_step)
  int64_t spin_ns;
  int64_t yield_ns;
};

size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

// How many ranks share a core: the ranks spread over the CPUs they may run on together. With
// more ranks than CPUs the algorithms change (see Engine), so the count must be the same on
// every rank: Segment::cpus is.
size_t ranks_per_core(const Segment& seg) {
  return ceil_div(static_cast<size_t>(seg.size()), static_cast<size_t>(seg.cpus()));
}

WaitPolicy wait_policy(size_t per_core) {
  if (per_core <= 1) return {kBlindSpins, 200'000, 2'000'000};
  return {0, 0, 500'000};
}

// The pipelined allreduce's chunk when ranks share cores: the ranks of one core together
// move about one slot per step, and never less than kPipelineChunk each. Fewer, larger
// steps save the context switches of each step's barrier. Min of 15 timings of 50 calls,
// plain stores, 2 cores, by chunk 256 KiB / 512 KiB / 1 MiB: 4 ranks, all_reduce of 1 MiB
// 187-202 / 171-172 / 175-191 us, 2 MiB 382 / 360 / 382, 4 MiB 915 / 775 / 971; 3 ranks,
// 1 MiB 178 / 157 / 197; 8 ranks, 1 MiB 409-462 / 448-535 / 535-677.
size_t shared_core_chunk(size_t per_core) {
  return std::max(kPipelineChunk, kSlotBytes / per_core / kLine * kLine);
}

// owner_computes' piece for tensors read through the kernel: kDirectPiece, shared by the ranks
// that share a core (the piece and its landing area should stay in that core's L2).
size_t direct_piece(size_t per_core) {
  return std::max<size_t>(kLine, kDirectPiece / per_core / kLine * kLine);
}

void copy(void* dst, const void* src, size_t n) { core::copy_bytes(dst, src, n); }

// The ways a pipelined allreduce can run (bits of a mode; SharedWriter::select).
constexpr int kModeStreaming = 1;    // streaming stores into the slots
constexpr int kModeLargeChunks = 2;  // chunks of kSlotBytes instead of Engine::small_chunk_

// Rank 0's verdict in a monitored barrier's step: passed, or the first rank that did not
// arrive (kMonitoredFirstMissing + its rank).
constexpr uint64_t kMonitoredPassed = 1;
constexpr uint64_t kMonitoredFirstMissing = 2;

// Copies into memory that peers read after every write: the slots and the p2p channels.
//
// Plain stores first take each line back from the reader's cache. On this project's KVM
// guests that is cheap most of the time and, for seconds at a time (while the host runs the
// two vCPUs on different core complexes: a cache line's round trip then takes ~300 ns instead
// of ~65), several times the copy itself. Writing n bytes and having a peer read them
// (EPYC Zen 4 guest, plain against streaming stores): 4 KiB 0.5 us against 1.4 in the fast
// placement, 2.4 against 1.5 in the slow one; 256 KiB 44 against 27, and 170 against 30;
// 1 MiB 100 against 115, and 480-660 against 90-120. The writer's own timing cannot choose
// (streaming copies always look 3-7x faster to it, as the readers pay for them), so with
// C10D_SHM_STREAM=auto whole operations are timed: a ModeProbe per type of operation and
// size class (select) keeps whichever mode ran them faster, probing again every 50 ms; only
// the probes read the clock. The writers of one-sided operations (a broadcast's root, a
// gather's senders) return before their readers finish, so their probes lean to streaming:
// in the fast placement a gather of 4 KiB then takes 1.6 us against 1.1 with plain stores,
// which cost 5x in the slow placement (5 launches each, medians; broadcast of 1 MiB: 87 us
// auto, 141 plain, 82 streaming). A writer without begin_op/select/end_op (the p2p channels)
// keeps plain stores. C10D_SHM_STREAM=0/1 fixes the choice.
class SharedWriter {
 public:
  // `may_adapt`: whether auto may choose streaming stores (the collectives; the p2p channels
  // keep plain ones). Also when ranks outnumber cores: 4 ranks on 2 cores, plain against
  // streaming, all_reduce of 256 KiB 52-94 us against 85-125 in the fast placement and 207-269
  // against 83-134 in the slow one (4 MiB: 0.8-1.5 ms against 1.2-2.3, 3.6-4.5 against
  // 1.2-2.0); all_to_all and gather alike, broadcast faster streaming in both.
  // `leader`: rank 0, whose probes choose the mode of the pipelined allreduces (select);
  // `choose_chunks`: whether they also choose its chunk size (every rank has a core of its
  // own; see kPipelineChunk).
  explicit SharedWriter(bool may_adapt = false, bool leader = false, bool choose_chunks = false)
      : leader_(leader), choose_chunks_(choose_chunks) {
    found_.fill(-1);
    probes_.fill(ModeProbe(probe_config()));
    if (core::env_string(core::kEnvShmStream) == "auto") {
      adaptive_ = may_adapt;
    } else {
      streaming_ = core::env_bool(core::kEnvShmStream);
    }
  }

  void operator()(void* dst, const void* src, size_t n) { write(dst, src, n, streaming_); }
  // A copy that only ranks on this rank's CPU read: plain stores in either mode, counted like
  // the others (probes compare cost per byte written).
  void same_cpu(void* dst, const void* src, size_t n) { write(dst, src, n, false); }

  void begin_op(OpType type) {
    written_ = 0;
    type_ = probed_as(type);
    probe_ = nullptr;
  }

  // The operation moves `bytes` per rank: its type and size class choose the probe.
  //
  // A pipelined allreduce (an allreduce of more than kPipelineChunk bytes) runs in the mode
  // `agreed` (kModeStreaming, kModeLargeChunks) that rank 0 proposed in the previous one
  // (Engine::pipelined). Rank 0 (the leader) times it and proposes what its probe wants next
  // (proposal), with large chunks only where the chunk is chosen (choose_chunks); the other
  // ranks do not probe it. Each rank choosing its own stores mixed the modes, and a rank's
  // probe then timed the others' choices as much as its own: 4 ranks on 2 cores kept
  // streaming stores (all_reduce of 1 MiB 281 us) while plain ones ran it in 189.
  void select(size_t bytes, int agreed) {
    proposal_ = agreed;
    if (!adaptive_) return;
    probe_ = nullptr;
    const bool pipelined = bytes > kPipelineChunk && type_ == OpType::kAllreduce;
    streaming_ = pipelined && (agreed & kModeStreaming) != 0;
    if (bytes < kProbedBytes) return;  // streaming would not change them (core::stream_bytes)
    if (pipelined && !leader_) return;
    const size_t size_class = std::min<size_t>(
        kSizeClasses - 1, (std::bit_width(bytes) - std::bit_width(kProbedBytes)) / 2);
    const size_t type = std::min(static_cast<size_t>(type_), kTypes - 1);
    ModeProbe& probe = probes_[type * kSizeClasses + size_class];
    const int modes = pipelined && choose_chunks_ ? 4 : 2;
    if (probe.modes() < modes) probe = ModeProbe(probe_config(), modes);
    // A kind not probed yet starts with the mode the ranks run now (pipelined), or else with
    // the stores this type's last probe found best at another size (or any type's, for the
    // first), as that depends mostly on the placement.
    if (probe.untried()) {
      const int found = found_[type] >= 0 ? found_[type] : found_any_;
      const int stores = found > 0 ? kModeStreaming : 0;
      probe.adopt(!pipelined ? stores
                  : found < 0 ? agreed & (modes - 1)
                              : (agreed & (modes - 1) & ~kModeStreaming) | stores);
    }
    probe_ = &probe;
    bytes_ = bytes;
    const int mode = probe.mode();
    if (pipelined) {
      proposal_ = mode;
      ran_ = agreed & (modes - 1);
    } else {
      streaming_ = (mode & kModeStreaming) != 0;
      ran_ = mode & kModeStreaming;
    }
    timed_ = probe.wants_time();
    if (timed_) start_ = now_ns();
  }

  // Operations that move data alike share probes: reduce and the coalesced allreduce run
  // the pipelined allreduce. Each type probing alone started from whatever another type found
  // last (untried), and a benchmark's rows are too short for a probe: reduce then ran with
  // the stores broadcast's probe had found, at half all_reduce's speed.
  static OpType probed_as(OpType type) {
    return type == OpType::kReduce || type == OpType::kAllreduceCoalesced ? OpType::kAllreduce
                                                                         : type;
  }

  // Whether the writers of this type return before their readers finish: their probes time
  // only the writing, which favours streaming stores, so other types do not start from their
  // finds.
  static bool one_sided(OpType type) {
    return type == OpType::kBroadcast || type == OpType::kGather || type == OpType::kScatter;
  }

  // The mode this rank proposes for the next pipelined allreduce (rank 0's is taken).
  int proposal() const { return proposal_; }

  // Whether this operation's copies use streaming stores.
  bool streaming() const { return streaming_; }

  // Whether the stores are chosen by timing (C10D_SHM_STREAM=auto).
  bool adaptive() const { return adaptive_; }
  // For calibration: the stores of the copies until the next operation selects again.
  void use_streaming(bool on) { streaming_ = on; }
  // The stores calibration found faster: every kind of operation starts with them until its
  // own probe (ModeProbe) says otherwise.
  void seed(bool streaming) {
    if (adaptive_) found_any_ = streaming ? 1 : 0;
  }

  // The host moved the vCPUs apart (`far`) or together (Engine::watch_placement): what the
  // probes found no longer holds, so every kind of operation takes the stores that suit the
  // new placement (streaming when far) until its next probe. Without this a benchmark's rows,
  // too short for a probe, kept plain stores through the slow placement: all_reduce of 1 MiB
  // took 430-490 us with them and 82-91 with streaming ones (47 plain before the move).
  void placement_changed(bool far) {
    if (!adaptive_) return;
    found_.fill(-1);
    found_any_ = far ? 1 : 0;
    for (ModeProbe& probe : probes_) {
      probe.hold((probe.held() & ~kModeStreaming) | (far ? kModeStreaming : 0));
    }
  }

  // The operation begun last completed (not called when it failed).
  void end_op() {
    if (probe_ == nullptr || written_ < kProbedBytes) return;
    if (!timed_) return probe_->skip();
    const int64_t now = now_ns();
    const double cost = static_cast<double>(now - start_) / static_cast<double>(written_);
    if (probe_->record(cost, now, bytes_, ran_, now - start_)) {  // a probe ended
      found_[std::min(static_cast<size_t>(type_), kTypes - 1)] = probe_->mode() & 1;
      if (!one_sided(type_)) found_any_ = probe_->mode() & 1;
      if (core::log_enabled(core::LogLevel::kDebug)) {
        core::log(core::LogLevel::kDebug,
                  str_cat("shm store probe: ", core::op_type_name(type_), " of ", bytes_,
                          " bytes keeps mode ", probe_->mode(), " (bit 0 streaming, bit 1 ",
                          "large chunks) on cpu ", ::sched_getcpu()));
      }
    }
  }

 private:
  void write(void* dst, const void* src, size_t n, bool stream) {
    written_ += n;
    if (stream) return core::stream_bytes(dst, src, n);
    core::copy_bytes(dst, src, n);
  }

  static constexpr size_t kProbedBytes = size_t{4} << 10;
  // A kind of operation is first probed once it took 200 ms in all. Before, a benchmark's row
  // often ran inside a probe (the first came after 8 operations) and timed its slower modes:
  // reduce, which shares all_reduce's probes and came after its rows, ran 1 MiB in 322 us
  // against all_reduce's 77, and the row of 16 MiB all_reduce held the probe of 4-64 MiB.
  static ModeProbe::Config probe_config() {
    ModeProbe::Config config;
    config.first_hold_ns = 200'000'000;
    return config;
  }
  // Size classes by powers of 4 from 4 KiB: [4, 16) KiB ... [1, 4) MiB, 4 MiB and up.
  static constexpr size_t kSizeClasses = 6;
  static constexpr size_t kTypes = static_cast<size_t>(OpType::kUnknown) + 1;
  const bool leader_;
  const bool choose_chunks_;
  bool adaptive_ = false;
  bool streaming_ = false;
  bool timed_ = false;
  int proposal_ = 0;
  int ran_ = 0;  // the mode the operation runs in
  OpType type_ = OpType::kUnknown;
  size_t written_ = 0;
  size_t bytes_ = 0;
  int64_t start_ = 0;
  ModeProbe* probe_ = nullptr;
  std::array<ModeProbe, kTypes * kSizeClasses> probes_;
  // The stores (1: streaming) the latest probe of each type found best, or -1; of any type.
  std::array<int, kTypes> found_;
  int found_any_ = -1;
};

// Elements per piece when `count` elements are split across `size` owners, rounded up to a
// whole cache line of elements so owners never share a line.
size_t piece_elems(size_t count, int size, size_t element) {
  const size_t align = std::max<size_t>(1, kLine / element);
  return (ceil_div(count, static_cast<size_t>(size)) + align - 1) / align * align;
}

// Piece j of `count` elements: [begin, begin + len).
void piece_of(size_t count, int size, size_t element, int j, size_t& begin, size_t& len) {
  const size_t per = piece_elems(count, size, element);
  begin = std::min(count, per * static_cast<size_t>(j));
  len = std::min(count, begin + per) - begin;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Engine: the collective algorithms over the step protocol. One operation at a time runs in an
// Engine: the one whose caller set the backend's Queue::running (see ShmBackend); `aborted`
// may be set from any thread.

class Engine {
 public:
  Engine(std::shared_ptr<Segment> segment, bool pinned)
      : segment_(std::move(segment)),
        seg_(*segment_),
        rank_(seg_.rank()),
        size_(seg_.size()),
        per_core_(ranks_per_core(seg_)),
        policy_(wait_policy(per_core_)),
        own_core_(per_core_ <= 1),
        direct_piece_(direct_piece(per_core_)),
        direct_allreduce_(own_core_ ? kDirectAllreduceBytes : kDirectAllreduceSharedCoreBytes),
        small_chunk_(own_core_ ? kPipelineChunk : shared_core_chunk(per_core_)),
        far_trip_ns_(core::env_int(core::kEnvShmFarTripNs)),
        copy_shared(/*may_adapt=*/true, /*leader=*/rank_ == 0, /*choose_chunks=*/own_core_),
        cpu_group_(pinned && !own_core_ ? rank_ % seg_.cpus() : -1) {}

  std::atomic<bool> aborted{false};
  std::string broken;  // why the step flags can no longer be trusted (set while running)

  const std::shared_ptr<Segment>& segment() const { return segment_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  const WaitPolicy& policy() const { return policy_; }

  // The operation about to run; throws when the engine cannot run it.
  void begin(const char* name, OpType type, uint64_t seq, Millis timeout) {
    name_ = name;
    seq_ = seq;
    described_ = StepDescription{};
    described_.seq = seq;
    described_.type = static_cast<uint8_t>(type);
    op_ = signature(described_);
    timeout_ = timeout;
    deadline_started_ = false;  // see await_step
    if (!broken.empty()) {
      throw DistBackendError(
          str_cat(describe(), ": the backend is unusable after an earlier failure: ", broken));
    }
    if (aborted.load()) throw DistBackendError(str_cat(describe(), ": the backend was shut down"));
    copy_shared.begin_op(type);
  }

  // The operation begun last completed.
  void end() { copy_shared.end_op(); }

  // What rank 0's latest timing of round trips found (whether ranks 0 and 1 run far apart),
  // once it timed any (watch_placement); read from its placement word, so from any thread.
  std::optional<bool> far_apart() const {
    const uint64_t word = seg_.header(0)->placement.load(std::memory_order_acquire);
    if ((word & kTimedBit) == 0) return std::nullopt;
    return (word & kFarBit) != 0;
  }

  std::string describe() const {
    return str_cat("shm ", name_, " (sequence ", seq_, ", rank ", rank_, " of ", size_, ")");
  }

  // Times pipelined allreduces of kCalibrationBytes in both chunk sizes (interleaved) and
  // starts with the faster one on rank 0: which wins depends on the machine (kPipelineChunk).
  // With stores that adapt, plain and streaming ones too (see SharedWriter). Ranks that share
  // cores keep their chunk size and only time the stores, if they adapt.
  void calibrate(Millis timeout) {
    std::vector<int> modes;  // kModeStreaming, kModeLargeChunks
    for (int mode = 0; mode < 4; ++mode) {
      if ((mode & kModeStreaming) != 0 && !copy_shared.adaptive()) continue;
      if ((mode & kModeLargeChunks) != 0 && !own_core_) continue;
      modes.push_back(mode);
    }
    if (size_ < 2 || modes.size() < 2) return;
    begin("chunk calibration", OpType::kAllreduce, 0, timeout);
    const size_t count = kCalibrationBytes / sizeof(float);
    std::vector<float> data(count, 1.0f);
    char* bytes = reinterpret_cast<char*>(data.data());
    const bool stores = copy_shared.streaming();  // as C10D_SHM_STREAM fixed them, if it did
    std::vector<int64_t> best(modes.size(), INT64_MAX);
    // Ranks sharing cores time 16 allreduces in all: more would add ~100 ms to
    // initialisation at 4 and 8 ranks on 2 cores.
    const size_t rounds = own_core_ ? kCalibrationRounds : 16 / modes.size() / 2;
    const int runs = own_core_ ? kCalibrationRuns : 2;
    for (size_t i = 0; i < modes.size() * rounds; ++i) {
      const int mode = modes[i % modes.size()];
      if (copy_shared.adaptive()) copy_shared.use_streaming((mode & kModeStreaming) != 0);
      for (int run = 0; run < runs; ++run) {
        const int64_t start = now_ns();
        pipelined(bytes, bytes, count, DType::kFloat32, ReduceOp(ReduceOp::MAX), false,
                  (mode & kModeLargeChunks) != 0);
        int64_t& b = best[i % modes.size()];
        if (run > 0) b = std::min(b, now_ns() - start);
      }
    }
    copy_shared.use_streaming(stores);
    // Rank 0's timings decide for every rank.
    const uint32_t s = next_step();
    if (rank_ == 0) {
      const int mode = modes[std::min_element(best.begin(), best.end()) - best.begin()];
      rank0_word(s) = static_cast<uint64_t>(mode);
      seg_.header(0)->placement.store((mode & kModeStreaming) != 0 ? kFarBit : 0,
                                      std::memory_order_relaxed);
    }
    sync(s);
    agreed_mode_ = static_cast<int>(rank0_word(s));
    copy_shared.seed((agreed_mode_ & kModeStreaming) != 0);
    // Streaming stores won calibration if the vCPUs were far apart (plain ones win otherwise);
    // from here the round trips tell.
    far_ = (agreed_mode_ & kModeStreaming) != 0;
    watching_ = seg_.cpus() >= 2 && copy_shared.adaptive();
    next_placement_ns_ = now_ns() + kPlacementPeriodNs;
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

  // --- collectives (raw memory; every rank passes consistent sizes) ---

  void barrier() { sync(next_step()); }

  // Rank 0 waits (the operation's timeout) for every other rank to publish its arrival, then
  // publishes its verdict with the same step: the other ranks wait for that step only, so one
  // that arrives after rank 0 gave up on it hears of the failure at once, and none passes
  // unless rank 0 saw everyone. Rank 0 fails naming the ranks that did not arrive: the first
  // one, or with `wait_all_ranks` every one, which then means waiting on for the others after
  // a peer exited (until they arrive, exit too, or the deadline passes). The verdict names
  // the first missing rank, so the others can too. `monitored` is the caller's timeout (rank
  // 0's; the others wait theirs, pg::monitored_barrier_release_wait).
  void monitored_barrier(bool wait_all_ranks, Millis monitored) {
    const uint32_t s = next_step();
    if (rank_ != 0) {
      publish(s);
      try {
        wait_peer(0, s);
      } catch (const DistTimeoutError&) {
        fail<DistTimeoutError>(pg::monitored_barrier_unreleased(rank_, timeout_));
      } catch (const DistBackendError& e) {
        if (aborted.load()) throw;
        fail<DistBackendError>(
            str_cat(pg::monitored_barrier_failure_on(rank_), " (", e.what(), ")"));
      }
      step_ = s;
      const uint64_t verdict = rank0_word(s);
      if (verdict == kMonitoredPassed) return;
      fail<DistBackendError>(str_cat(
          pg::monitored_barrier_failure_on(rank_), " (rank 0: ",
          pg::monitored_barrier_missing({static_cast<int>(verdict - kMonitoredFirstMissing)},
                                        monitored),
          ")"));
    }
    try {
      for (int r = 1; r < size_; ++r) wait_peer(r, s);
      rank0_word(s) = kMonitoredPassed;
      finish_step(s);
      all_reached_ = s;
      return;
    } catch (const DistTimeoutError&) {
    } catch (const DistBackendError&) {
      // A peer that exited is reported as not arriving; other failures (a mismatched
      // operation, a shutdown) stand as they are.
      const std::vector<int> missing = not_arrived(s);
      if (aborted.load() || std::none_of(missing.begin(), missing.end(), [&](int r) {
            return r != rank_ && !seg_.peer_gone(r).empty();
          })) {
        throw;
      }
    }
    std::vector<std::string> gone(size_);
    for (bool waiting = true; waiting;) {
      waiting = false;
      for (int r : not_arrived(s)) {
        if (r == rank_ || !gone[r].empty()) continue;
        gone[r] = seg_.peer_gone(r);
        waiting = waiting || (wait_all_ranks && gone[r].empty());
      }
      if (waiting && (deadline_.expired() || aborted.load())) break;
      if (waiting) ::usleep(1000);
    }
    std::vector<int> missing = not_arrived(s);
    std::erase(missing, rank_);
    // The verdict for the ranks that arrived, and for those that still will (the last ones
    // may have come in just after the deadline).
    rank0_word(s) = missing.empty() ? kMonitoredPassed
                                    : kMonitoredFirstMissing + static_cast<uint64_t>(missing[0]);
    finish_step(s);
    if (missing.empty()) return;
    if (!wait_all_ranks && missing.size() > 1) missing.resize(1);
    std::string why;
    for (int r : missing) {
      if (!gone[r].empty()) why += str_cat(why.empty() ? " (" : "; ", "rank ", r, " ", gone[r]);
    }
    if (!why.empty()) why += ")";
    const std::string message = pg::monitored_barrier_missing(missing, timeout_) + why;
    if (why.empty()) fail<DistTimeoutError>(message);
    fail<DistBackendError>(message);
  }

  void broadcast(char* data, size_t bytes, DType dtype, int root) {
    expect_moved(bytes, dtype, root);
    if (bytes == 0 || size_ == 1) return;
    if (bytes > kOneShotBytes) {
      // A root tensor in the shared heap is read in place by every other rank; a large one
      // elsewhere is read through the kernel.
      const std::vector<Where>& where = locate(data, bytes);
      if (where[root].mapped != nullptr || direct_fanout(bytes) ||
          direct_mid(bytes, kBroadcastMidEndBytes)) {
        if (rank_ != root) fetch(where[root], root, data, bytes);
        sync(next_step());  // the root's tensor must not change while peers read it
        return;
      }
    }
    // One-sided: the root publishes and moves on; the others wait only for the root. Large
    // tensors go in chunks, so the root writes one while the others read the one before.
    const bool small = fits_ring(bytes);
    const bool boxed = fits_mailbox(bytes);
    for (size_t off = 0; off < bytes; off += kPipelineChunk) {
      const size_t len = std::min(kPipelineChunk, bytes - off);
      const uint32_t s = next_step(small, true);
      if (rank_ == root) {
        copy_shared(step_data(rank_, s, small, boxed), data + off, len);
        if (boxed) seal_mailbox(s, len);
        sent_unchecked(s);
      } else {
        wait_step_data(root, s, boxed);
        copy(data + off, step_data(root, s, small, boxed), len);
      }
      finish_step(s);
    }
  }

  // Reduces `count` elements of every rank's `in` (left unchanged unless it is `out`) into
  // `out`; `out` is null on ranks that do not want the result. `root` is -1 when every rank
  // wants it (allreduce, which allows the zero-copy path), else the one rank that does
  // (reduce); it is part of the step's signature, so ranks that disagree on it fail. With
  // premul_done the caller already scaled the input of a PREMUL_SUM.
  void allreduce(const char* in, char* out, size_t count, DType dtype, const ReduceOp& op,
                 int root, bool premul_done = false) {
    expect(count, dtype, root, op.kind);
    const bool everyone = root < 0;
    if (count == 0) return;
    const size_t es = core::element_size(dtype);
    const size_t bytes = count * es;
    const bool premul = !premul_done && op.kind == ReduceOp::PREMUL_SUM;
    if (size_ == 1) {
      if (out == nullptr) return;
      copy(out, in, bytes);
      if (premul) core::apply_premul(out, count, dtype, op);
      core::apply_postdiv(out, count, dtype, op, size_);
      return;
    }
    if (bytes <= kOneShotBytes) return one_shot(in, out, count, dtype, op, premul);
    if (everyone && in == out) {
      // Owner computes on the tensors themselves when every rank's lies in its shared heap,
      // or mostly does (aliases), or, for large ones, through the kernel.
      const std::vector<Where>& where = locate(out, bytes);
      if (all_mapped(where) ||
          (seg_.cma() && (bytes >= direct_allreduce_bytes() || mostly_mapped(where, bytes)))) {
        return owner_computes(where, out, count, dtype, op, premul);
      }
    }
    pipelined(in, out, count, dtype, op, premul);
  }

  // Every rank publishes `bytes` from `in`; dst(r) (null to skip) receives rank r's bytes.
  template <typename Dst>
  void allgather(const char* in, size_t bytes, DType dtype, Dst&& dst) {
    expect_moved(bytes, dtype);
    if (bytes == 0) return;
    if (bytes > kOneShotBytes && size_ > 1) {
      // Inputs are read in place when every rank's is in the shared heap, or through the
      // kernel when large.
      const std::vector<Where>& where = locate(in, bytes);
      if (all_mapped(where) || direct_fanout(bytes) || direct_mid(bytes)) {
        for (int r = 0; r < size_; ++r) {
          char* d = dst(r);
          if (d == nullptr) continue;
          if (r == rank_) {
            copy(d, in, bytes);
          } else {
            fetch(where[r], r, d, bytes);
          }
        }
        sync(next_step());  // inputs must not change while peers read them
        return;
      }
    }
    for (size_t off = 0; off < bytes; off += kSlotBytes) {
      const size_t len = std::min(kSlotBytes, bytes - off);
      const uint32_t s = next_step();
      if (size_ > 1) copy_shared(seg_.in(rank_, s), in + off, len);
      sync(s);
      for (int r = 0; r < size_; ++r) {
        char* d = dst(r);
        if (d != nullptr) copy(d + off, r == rank_ ? in + off : seg_.in(r, s), len);
      }
    }
  }

  // Rank `root` receives every rank's `bytes` from `in` at out_of(r) (called on the root
  // only). One-sided: only the root waits.
  template <typename Out>
  void gather(const char* in, size_t bytes, DType dtype, int root, Out&& out_of) {
    expect_moved(bytes, dtype, root);
    if (bytes == 0) return;
    if (direct_fanout(bytes) && size_ > 1) {
      return allgather(in, bytes, dtype,
                       [&](int r) { return rank_ == root ? out_of(r) : nullptr; });
    }
    const bool small = fits_ring(bytes);
    const bool boxed = fits_mailbox(bytes);
    for (size_t off = 0; off < bytes; off += kPipelineChunk) {
      const size_t len = std::min(kPipelineChunk, bytes - off);
      const uint32_t s = next_step(small, true);
      if (rank_ != root) {
        copy_shared(step_data(rank_, s, small, boxed), in + off, len);
        if (boxed) seal_mailbox(s, len);
      } else {
        for (int r = 0; r < size_; ++r) {
          if (r == root) {
            copy(out_of(r) + off, in + off, len);
          } else {
            wait_step_data(r, s, boxed);
            copy(out_of(r) + off, step_data(r, s, small, boxed), len);
          }
        }
      }
      finish_step(s);
    }
  }

  // The root sends src_of(j) (bytes each; called on the root only) to rank j's `out`.
  template <typename Src>
  void scatter(Src&& src_of, char* out, size_t bytes, DType dtype, int root) {
    expect_moved(bytes, dtype, root);
    if (bytes == 0) return;
    if ((direct(bytes) || direct_mid(bytes)) && size_ > 1 && size_ <= kMaxRanks) {
      // Every rank reads its part from the root's list through the kernel (mid-sized parts
      // too with a core per rank: 2 ranks, parts of 128 KiB, time until every rank is done,
      // 3 launches each: 12-16 us against 19-25 through the slots).
      const uint32_t s = next_step();
      if (rank_ == root) {
        auto* table = reinterpret_cast<uint64_t*>(seg_.meta(rank_, s));
        for (int j = 0; j < size_; ++j) table[j] = reinterpret_cast<uint64_t>(src_of(j));
      }
      sync(s);
      if (rank_ == root) {
        copy(out, src_of(rank_), bytes);
      } else {
        read_from(root, out, reinterpret_cast<const uint64_t*>(seg_.meta(root, s))[rank_], bytes);
      }
      sync(next_step());  // the root's list must not change while peers read it
      return;
    }
    // Every part in one ring entry when they fit, else in rounds of the slot.
    const size_t part = ceil_div(bytes, kLine) * kLine;
    const bool small = fits_ring(part * static_cast<size_t>(size_));
    // The parts packed one after another when they fit a mailbox together.
    const bool boxed = fits_mailbox(bytes * static_cast<size_t>(size_));
    const size_t quota = boxed ? bytes : small ? part : kSlotBytes / size_ / kLine * kLine;
    for (size_t off = 0; off < bytes; off += quota) {
      const size_t len = std::min(quota, bytes - off);
      const uint32_t s = next_step(small, true);
      // One-sided, as broadcast: the root fills round k + 1 while the others copy out round k
      // (2 ranks, 3 launches: parts of 1 MiB 73-86 us against 98-164 before).
      if (rank_ == root) {
        char* parts = step_data(root, s, small, boxed);
        for (int j = 0; j < size_; ++j) {
          if (j != root) copy_shared(parts + j * quota, src_of(j) + off, len);
        }
        if (boxed) seal_mailbox(s, quota * static_cast<size_t>(size_));
        sent_unchecked(s);
        copy(out + off, src_of(rank_) + off, len);
      } else {
        wait_step_data(root, s, boxed);
        copy(out + off, step_data(root, s, small, boxed) + rank_ * quota, len);
      }
      finish_step(s);
    }
  }

  // blocks[j] (count elements) is this rank's contribution to rank j's `out`.
  template <typename Block>
  void reduce_scatter(Block&& block_of, char* out, size_t count, DType dtype,
                      const ReduceOp& op) {
    expect(count, dtype, -1, op.kind);
    if (count == 0) return;
    const size_t es = core::element_size(dtype);
    const bool premul = op.kind == ReduceOp::PREMUL_SUM;
    const size_t quota = kSlotBytes / size_ / kLine * kLine / es;  // elements per rank per round
    for (size_t off = 0; off < count; off += quota) {
      const size_t m = std::min(quota, count - off);
      const uint32_t s = next_step();
      for (int j = 0; j < size_; ++j) {
        char* slot = seg_.in(rank_, s) + j * quota * es;
        copy_shared(slot, block_of(j) + off * es, m * es);
        if (premul) core::apply_premul(slot, m, dtype, op);
      }
      sync(s);
      char* dst = out + off * es;
      const size_t at = rank_ * quota * es;
      reduce_sources(dst, m, dtype, op, [&](int j) { return seg_.in(j, s) + at; });
    }
  }

  // reduce_scatter of one flat input: block j (count elements) of `in` goes to rank j.
  void reduce_scatter_flat(const char* in, char* out, size_t count, DType dtype,
                           const ReduceOp& op) {
    const size_t block = count * core::element_size(dtype);
    reduce_scatter([&](int j) { return in + j * block; }, out, count, dtype, op);
  }

  // alltoall with equal parts: part j (`bytes` each) of `in` goes to rank j, whose part
  // for this rank lands in part j of `out`.
  void alltoall_equal(const char* in, char* out, size_t bytes) {
    equal_send_.resize(size_);
    equal_recv_.resize(size_);
    equal_lens_.assign(size_, bytes);
    for (int j = 0; j < size_; ++j) {
      equal_send_[j] = in + j * bytes;
      equal_recv_[j] = out + j * bytes;
    }
    alltoall(equal_send_, equal_lens_, equal_recv_, equal_lens_);
  }

  // This rank sends send_len[j] bytes at send[j] to rank j and receives recv_len[j] bytes from
  // it. A size that does not match the sender's is reported after the exchange (so every rank
  // still takes the same steps).
  void alltoall(const std::vector<const char*>& send, const std::vector<size_t>& send_len,
                const std::vector<char*>& recv, const std::vector<size_t>& recv_len) {
    // Step 1: everyone learns every send size (and so the number of rounds).
    // With the sizes go the send addresses, for the direct path, and small parts themselves:
    // a rank whose parts all fit `small` writes them too, and when every rank did (each sees
    // all sizes) this step is the whole exchange.
    copy_shared.select(std::accumulate(send_len.begin(), send_len.end(), size_t{0}), agreed_mode_);
    const bool addresses = seg_.cma() && 2 * size_ <= kMaxRanks;
    const size_t quota = kSlotBytes / size_ / kLine * kLine;
    const size_t small = std::min(quota, kOneShotBytes);
    uint32_t s = next_step();
    auto* table = reinterpret_cast<uint64_t*>(seg_.meta(rank_, s));
    for (int j = 0; j < size_; ++j) table[j] = send_len[j];
    if (addresses) {
      for (int j = 0; j < size_; ++j) table[size_ + j] = reinterpret_cast<uint64_t>(send[j]);
    }
    if (*std::max_element(send_len.begin(), send_len.end()) <= small) {
      for (int j = 0; j < size_; ++j) {
        if (j != rank_) copy_shared(seg_.in(rank_, s) + j * quota, send[j], send_len[j]);
      }
    }
    sync(s);
    std::vector<size_t>& incoming = incoming_;
    incoming.resize(size_);
    size_t longest = 0;
    for (int i = 0; i < size_; ++i) {
      const auto* t = reinterpret_cast<const uint64_t*>(seg_.meta(i, s));
      for (int j = 0; j < size_; ++j) longest = std::max<size_t>(longest, t[j]);
      incoming[i] = t[rank_];
    }
    std::string mismatch;
    for (int j = 0; j < size_; ++j) {
      if (incoming[j] != recv_len[j] && mismatch.empty()) {
        mismatch = str_cat(describe(), ": rank ", j, " sends ", incoming[j],
                           " bytes but this rank expects ", recv_len[j]);
      }
    }
    copy(recv[rank_], send[rank_], std::min(send_len[rank_], recv_len[rank_]));
    if (longest <= small) {
      for (int j = 0; j < size_; ++j) {
        const size_t n = std::min(incoming[j], recv_len[j]);
        if (j != rank_) copy(recv[j], seg_.in(j, s) + rank_ * quota, n);
      }
      if (!mismatch.empty()) throw core::InvalidArgument(mismatch);
      return;
    }
    if (addresses && (direct(longest) || direct_mid(longest))) {
      for (int j = 0; j < size_; ++j) {
        const auto* t = reinterpret_cast<const uint64_t*>(seg_.meta(j, s));
        if (j != rank_) read_from(j, recv[j], t[size_ + rank_], std::min(incoming[j], recv_len[j]));
      }
      sync(next_step());  // send buffers must not change while peers read them
      if (!mismatch.empty()) throw core::InvalidArgument(mismatch);
      return;
    }
    for (size_t off = 0; off < longest && size_ > 1; off += quota) {
      s = next_step();
      for (int j = 0; j < size_; ++j) {
        if (j == rank_ || send_len[j] <= off) continue;
        copy_shared(seg_.in(rank_, s) + j * quota, send[j] + off,
                    std::min(quota, send_len[j] - off));
      }
      sync(s);
      for (int j = 0; j < size_; ++j) {
        const size_t n = std::min(incoming[j], recv_len[j]);
        if (j == rank_ || n <= off) continue;
        copy(recv[j] + off, seg_.in(j, s) + rank_ * quota, std::min(quota, n - off));
      }
    }
    if (!mismatch.empty()) throw core::InvalidArgument(mismatch);
  }

 private:
  void one_shot(const char* in, char* out, size_t count, DType dtype, const ReduceOp& op,
                bool premul) {
    const size_t bytes = count * core::element_size(dtype);
    if (fits_mailbox(bytes)) return one_shot_mailbox(in, out, count, dtype, op, premul);
    const bool small = fits_ring(bytes);
    const uint32_t s = next_step(small);
    char* mine = slot(rank_, s, small);
    copy_shared(mine, in, bytes);
    if (premul) core::apply_premul(mine, count, dtype, op);
    if (out == nullptr) return finish_step(s);  // reduce: only the root waits
    sync(s);
    reduce_sources(out, count, dtype, op, [&](int r) { return slot(r, s, small); });
  }

  // one_shot for messages that fit a Mailbox: every rank writes its contribution and the step
  // into its mailbox line, then publishes the step as usual; the peers spin on that line, so
  // the data comes with the step. A peer not there within the spins is waited for as usual
  // (wait_peer: deadlines, dead peers, sleeping), after which its mailbox holds the step.
  // Ranks without `out` (reduce's non-roots) only write.
  void one_shot_mailbox(const char* in, char* out, size_t count, DType dtype,
                        const ReduceOp& op, bool premul) {
    const size_t bytes = count * core::element_size(dtype);
    const uint32_t s = next_step(true);
    char* mine = mailbox_data(rank_, s);
    std::memcpy(mine, in, bytes);
    if (premul) core::apply_premul(mine, count, dtype, op);
    seal_mailbox(s, bytes);
    if (out == nullptr) return finish_step(s);
    publish(s);
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) await_mailbox(r, s);
    }
    step_ = s;
    all_reached_ = s;
    check_unchecked();
    reduce_sources(out, count, dtype, op, [&](int r) { return mailbox_data(r, s); });
    claim_next_mailbox();
  }

  // Small steps whose data fits a Mailbox carry it there (see Mailbox and one_shot_mailbox):
  // the writer seals its mailbox after writing, before it publishes the step; a reader waits
  // with await_mailbox. The same answer on every rank for the same message.
  static bool fits_mailbox(size_t bytes) { return bytes <= Mailbox::kBytes; }
  char* mailbox_data(int r, uint32_t s) const {
    return reinterpret_cast<char*>(seg_.header(r)->mailbox[s % kRingDepth].data);
  }
  // This rank's mailbox for step s holds its `bytes` of data: the signature and the step go
  // with it. The step's end then claims the next mailbox (claim_next_mailbox).
  void seal_mailbox(uint32_t s, size_t bytes) {
    Mailbox& box = seg_.header(rank_)->mailbox[s % kRingDepth];
    box.op.store(op_, std::memory_order_relaxed);
    box.step.store(s, std::memory_order_release);
    sealed_step_ = s;
    sealed_bytes_ = bytes;
  }

  // After a step in which this rank wrote its mailbox: asks for the lines the next step would
  // write with as many bytes in a writable state (PREFETCHW). The peers hold them from reading
  // step s + 1 - kRingDepth, and without the claim the next write would wait for every peer's
  // copy to be invalidated, a round trip between the CPUs, in publish()'s fence; claimed here,
  // that happens while this rank runs its caller's code. After the step, not at the seal: the
  // claims would slow the peers' reads of this step. 2 ranks far apart, all_reduce medians of
  // 5000 calls, 3-4 alternating launches: 1 KiB 1.01-1.19 us against 1.35-1.54 unclaimed
  // (1.21-1.30 claimed at the seal), 256 B 0.84-0.90 against 0.93-1.00.
  void claim_next_mailbox() {
    if (sealed_bytes_ == 0) return;
    const auto* next = reinterpret_cast<const char*>(
        &seg_.header(rank_)->mailbox[(sealed_step_ + 1) % kRingDepth]);
    const size_t used = offsetof(Mailbox, data) + sealed_bytes_;
    for (size_t at = 0; at < used; at += kLine) prefetch_for_write(next + at);
    sealed_bytes_ = 0;
  }
  // Rank r's data of small step s (ring entry or parity slot, or mailbox when `boxed`), and
  // the wait for it.
  char* step_data(int r, uint32_t s, bool small, bool boxed) const {
    return boxed ? mailbox_data(r, s) : slot(r, s, small);
  }
  void wait_step_data(int r, uint32_t s, bool boxed) {
    if (boxed) return await_mailbox(r, s);
    wait_peer(r, s);
  }

  // Until peer r's mailbox holds step s of this operation.
  void await_mailbox(int r, uint32_t s) {
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

  // Chunks of small_chunk_ bytes: at step k every rank copies in chunk k and, after the
  // barrier, copies out the reduced pieces of chunk k-1 and reduces its own piece of chunk k
  // into its out area of the next parity. One barrier per chunk. A rank's own piece stays out of the
  // slots: it reduces it straight from its input into its output (and then publishes it in
  // its out area), so only the peers' pieces are copied in and out. With PREMUL_SUM, whose
  // scaling is applied to the slot copies, every piece goes through the slots.
  //
  // The chunks are kSlotBytes large if `large` (calibrate) or else if the ranks agreed on that
  // in the previous pipelined allreduce: rank 0 proposes the mode of the next one (chunks and
  // stores, SharedWriter::select) in this one's first step, and every rank reads it after
  // the sync.
  void pipelined(const char* in, char* out, size_t count, DType dtype, const ReduceOp& op,
                 bool premul, std::optional<bool> large = std::nullopt) {
    const bool own_direct = !premul;
    const size_t es = core::element_size(dtype);
    const bool large_chunks = large.value_or((agreed_mode_ & kModeLargeChunks) != 0);
    const size_t chunk = (large_chunks ? kSlotBytes : small_chunk_) / es;
    const size_t chunks = ceil_div(count, chunk);
    for (size_t k = 0; k <= chunks; ++k) {
      const uint32_t s = next_step();
      const bool agree = k == 0 && !large.has_value();
      if (agree && rank_ == 0) rank0_word(s) = static_cast<uint64_t>(copy_shared.proposal());
      const size_t off = k * chunk;
      const size_t e = k < chunks ? std::min(chunk, count - off) : 0;
      size_t b = 0, len = 0;  // this rank's piece of chunk k
      if (e != 0) piece_of(e, size_, es, rank_, b, len);
      if (e != 0) {
        char* slot = seg_.in(rank_, s);
        const char* src = in + off * es;
        if (own_direct && cpu_group_ >= 0) {
          // Each peer's piece goes to that peer alone: a rank on this CPU reads it from the
          // caches, so it never takes streaming stores (see shares_cpu).
          for (int j = 0; j < size_; ++j) {
            if (j == rank_) continue;
            size_t pb, plen;
            piece_of(e, size_, es, j, pb, plen);
            if (shares_cpu(j)) {
              copy_shared.same_cpu(slot + pb * es, src + pb * es, plen * es);
            } else {
              copy_shared(slot + pb * es, src + pb * es, plen * es);
            }
          }
        } else if (own_direct) {
          copy_shared(slot, src, b * es);
          copy_shared(slot + (b + len) * es, src + (b + len) * es, (e - b - len) * es);
        } else {
          copy_shared(slot, src, e * es);
          if (premul) core::apply_premul(slot, e, dtype, op);
        }
      }
      sync(s);
      if (agree) agreed_mode_ = static_cast<int>(rank0_word(s));
      if (k >= 1 && out != nullptr) {
        const size_t prev_off = (k - 1) * chunk;
        const size_t prev_e = std::min(chunk, count - prev_off);
        for (int j = 0; j < size_; ++j) {
          if (own_direct && j == rank_) continue;  // already in place
          size_t pb, plen;
          piece_of(prev_e, size_, es, j, pb, plen);
          copy(out + (prev_off + pb) * es, seg_.out(j, s) + pb * es, plen * es);
        }
      }
      if (len == 0) continue;
      // Operands in a fixed order (this rank's, then the peers' by rank); each piece is
      // reduced by one rank only, so every rank gets identical bits.
      const char* mine = own_direct ? in + (off + b) * es : seg_.in(rank_, s) + b * es;
      char* published = seg_.out(rank_, s + 1) + b * es;
      char* dst = own_direct && out != nullptr ? out + (off + b) * es : published;
      if (out == nullptr && copy_shared.streaming()) {
        // The piece is only for the peers (reduce's non-roots): with streaming stores it
        // goes out through them too, from a private buffer, instead of by the reduction's
        // plain stores into lines the root just read (those cost 5-7x while the host keeps
        // the vCPUs apart: reduce of 256 KiB 98-102 us against 43 for all_reduce).
        if (scratch_.size() < len * es) scratch_.resize(len * es);
        dst = scratch_.data();
      }
      // Reduced in place when this rank keeps no result (reduce's non-roots, PREMUL_SUM).
      // Otherwise the piece goes on to `published` block by block, each copied while it is
      // still in L1 (kPublishBlock), except with streaming stores, whose fence per copy
      // would then come every few microseconds.
      const bool publish = dst != published;
      const size_t block = publish && !copy_shared.streaming() ? kPublishBlock / es : len;
      for (size_t o = 0; o < len; o += block) {
        const size_t n = std::min(block, len - o);
        reduce_sources(dst + o * es, n, dtype, op, [&](int j) {
          // This rank's operand first, then the peers' by rank.
          return (j == 0 ? mine : seg_.in(j <= rank_ ? j - 1 : j, s) + b * es) + o * es;
        });
        if (publish) copy_shared(published + o * es, dst + o * es, n * es);
      }
    }
  }

  // out = source(0) op source(1) op ... op source(size_ - 1), then op's post-step. The ranks
  // that reduce the same data pass its sources in the same order, so they compute identical
  // bits.
  template <typename Source>
  void reduce_sources(char* out, size_t count, DType dtype, const ReduceOp& op,
                      Source&& source) {
    sources_.resize(size_);
    for (int j = 0; j < size_; ++j) sources_[j] = source(j);
    core::reduce_many(out, sources_.data(), sources_.size(), count, dtype, op);
    core::apply_postdiv(out, count, dtype, op, size_);
  }

  // Rank 0's word in the meta area of step s: what rank 0 writes there before it publishes s,
  // every rank reads once it waited for s (pipelined's chunk agreement, calibrate's decision).
  uint64_t& rank0_word(uint32_t s) const {
    return *reinterpret_cast<uint64_t*>(seg_.meta(0, s));
  }

  // Whether a message of `bytes` goes straight between the ranks' memory (the same answer on
  // every rank).
  bool direct(size_t bytes) const { return seg_.cma() && bytes >= kDirectBytes; }
  // The same for broadcast, gather and all_gather, whose slot path (one-sided for broadcast
  // and gather) beats the direct one, whose final wait needs every rank to run, up to several
  // MiB. At 4 ranks on 2 cores, gather of 256 KiB per rank took 80-90 us against 150-190
  // direct (1 MiB per rank: 350-460 against 730-760), broadcast of 1 MiB 190-250 against
  // 315-400 (3 runs each). At 2 ranks (min of 7 timings, 2 runs): gather of 2 MiB per rank
  // 92-133 us against 180-185, broadcast of 2 MiB 81-132 against 144-149, all_gather of
  // 2 MiB 134-175 against 210-212; at 8 MiB broadcast 339-529 against 317-325, the others
  // even.
  bool direct_fanout(size_t bytes) const { return seg_.cma() && bytes >= kDirectFanoutBytes; }
  // Whether a mid-sized message of broadcast, all_gather or alltoall goes direct (see
  // kDirectMidBytes); the same answer on every rank.
  bool direct_mid(size_t bytes, size_t end = kDirectMidEndBytes) const {
    return own_core_ && seg_.cma() && bytes >= kDirectMidBytes && bytes < end;
  }

  // Where rank r's buffer of an operation is: mapped here (it lies in r's shared heap) or
  // only at an address in r's own address space.
  // Bytes [lo, hi) of it may also be mapped here, from `part` on: all of it when `mapped`,
  // else the pages of an ordinary buffer that r moved into its heap (alias.h).
  struct Where {
    char* mapped = nullptr;
    uint64_t address = 0;
    char* part = nullptr;
    size_t lo = 0;
    size_t hi = 0;
  };

  static bool all_mapped(const std::vector<Where>& where) {
    return std::all_of(where.begin(), where.end(),
                       [](const Where& w) { return w.mapped != nullptr; });
  }

  // Whether every rank's buffer is mapped here for at least half its bytes (the heap or an
  // alias), so that owner_computes reads most of it in place.
  static bool mostly_mapped(const std::vector<Where>& where, size_t bytes) {
    return std::all_of(where.begin(), where.end(), [&](const Where& w) {
      return w.part != nullptr && 2 * (w.hi - w.lo) >= bytes;
    });
  }

  // One two-sided step in which every rank publishes where [data, data + bytes) is.
  // The result lives in the engine (valid until the next locate).
  // The same step also hands every rank rank 0's view of the placement (located_far_).
  const std::vector<Where>& locate(const void* data, size_t bytes) {
    const uint32_t s = next_step();
    auto* meta = reinterpret_cast<int64_t*>(seg_.meta(rank_, s));
    meta[0] = seg_.heap_offset(data, bytes);
    meta[1] = static_cast<int64_t>(reinterpret_cast<uint64_t>(data));
    if (rank_ == 0) meta[2] = far_ ? 1 : 0;
    const AliasedPart part = meta[0] >= 0 ? AliasedPart{} : find_alias(seg_, data, bytes);
    meta[3] = part.hi > part.lo ? static_cast<int64_t>(part.heap_offset) : -1;
    meta[4] = static_cast<int64_t>(part.lo);
    meta[5] = static_cast<int64_t>(part.hi);
    sync(s);
    std::vector<Where>& where = where_;
    where.assign(size_, Where{});
    for (int r = 0; r < size_; ++r) {
      const auto* m = reinterpret_cast<const int64_t*>(seg_.meta(r, s));
      Where& w = where[r];
      w.address = static_cast<uint64_t>(m[1]);
      if (m[0] >= 0) {
        w.mapped = w.part = seg_.heap(r) + m[0];
        w.hi = bytes;
      } else if (m[3] >= 0) {
        w.lo = static_cast<size_t>(m[4]);
        w.hi = static_cast<size_t>(m[5]);
        w.part = seg_.heap(r) + m[3];
      }
    }
    located_far_ = reinterpret_cast<const int64_t*>(seg_.meta(0, s))[2] != 0;
    return where;
  }

  // From this size an allreduce of ordinary tensors goes through the kernel (right after
  // locate: every rank then holds the same located_far_, so every rank takes the same path).
  size_t direct_allreduce_bytes() const {
    return located_far_ ? std::min(direct_allreduce_, kDirectAllreduceFarBytes)
                        : direct_allreduce_;
  }

  // Copies rank r's buffer (`where`) into `dst`: from the mapping if there is one, else
  // through the kernel.
  void fetch(const Where& where, int r, char* dst, size_t bytes) {
    if (where.mapped != nullptr) return copy(dst, where.mapped, bytes);
    read_from(r, dst, where.address, bytes);
  }

  // Cross-memory copies that fail as this operation, naming the peer.
  void read_from(int r, void* local, uint64_t remote, size_t bytes) {
    try {
      seg_.read_peer(r, local, remote, bytes);
    } catch (const DistBackendError& e) {
      peer_copy_failed(r, e);
    }
  }

  [[noreturn]] void peer_copy_failed(int r, const DistBackendError& e) {
    const std::string gone = seg_.peer_gone(r);
    if (!gone.empty()) fail<DistBackendError>(str_cat(describe(), ": rank ", r, " ", gone));
    fail<DistBackendError>(str_cat(describe(), ": ", e.what()));
  }

  // Copies bytes [off, off + n) of rank r's buffer (`w`) into `dst`: what is mapped here from
  // the mapping, the rest through the kernel.
  void read_range(const Where& w, int r, char* dst, size_t off, size_t n) {
    size_t lo, hi;
    mapped_span(w, off, n, lo, hi);
    if (lo > off) read_from(r, dst, w.address + off, lo - off);
    if (hi > lo) copy(dst + (lo - off), w.part + (lo - w.lo), hi - lo);
    if (off + n > hi) read_from(r, dst + (hi - off), w.address + hi, off + n - hi);
  }

  // The mapped bytes [lo, hi) of [off, off + n) in `w` (lo == hi == off + n when none).
  static void mapped_span(const Where& w, size_t off, size_t n, size_t& lo, size_t& hi) {
    lo = hi = off + n;
    if (w.part == nullptr) return;
    lo = std::clamp(w.lo, off, off + n);
    hi = std::clamp(w.hi, lo, off + n);
  }

  // Owner computes on the ranks' own tensors (`where`, from locate), pulling only: rank r
  // reduces piece r of every peer's tensor into its own, then, after a step, copies every other
  // piece from its owner's tensor into its own. No rank ever writes into a peer's memory, so a
  // peer that resumes after this rank gave up on the operation cannot touch it. Reads come in
  // place where the peer's tensor is mapped here (shared heap, aliases), through the kernel
  // elsewhere: one copy in and one copy out per byte of the piece, and no slot in between.
  void owner_computes(const std::vector<Where>& where, char* data, size_t count, DType dtype,
                      const ReduceOp& op, bool premul) {
    const size_t es = core::element_size(dtype);
    const bool mapped = mostly_mapped(where, count * es);
    const size_t per = std::max<size_t>(1, (mapped ? kZeroCopyPiece : direct_piece_) / es);
    if (scratch_.size() < per * es) scratch_.resize(per * es);
    size_t b, len;
    piece_of(count, size_, es, rank_, b, len);
    for (size_t at = b; at < b + len; at += per) {
      const size_t m = std::min(per, b + len - at);
      const size_t off = at * es, n = m * es;
      char* acc = data + off;
      // PREMUL_SUM scales every input before the sum, as the other paths do: scaling the sum
      // instead overflows where the scaled inputs do not (float16, factor 1/n).
      if (premul) core::apply_premul(acc, m, dtype, op);
      for (int j = 0; j < size_; ++j) {
        if (j == rank_) continue;
        const Where& w = where[j];
        const char* theirs = scratch_.data();
        if (!premul && w.part != nullptr && off >= w.lo && off + n <= w.hi) {
          theirs = w.part + (off - w.lo);
        } else {
          read_range(w, j, scratch_.data(), off, n);
          if (premul) core::apply_premul(scratch_.data(), m, dtype, op);
        }
        core::reduce(acc, theirs, m, dtype, op);
      }
      core::apply_postdiv(acc, m, dtype, op, size_);
    }
    sync(next_step());  // every piece is reduced in its owner's tensor
    // Starting with the next rank's piece spreads the readers over the owners.
    for (int k = 1; k < size_; ++k) {
      const int j = (rank_ + k) % size_;
      piece_of(count, size_, es, j, b, len);
      if (len != 0) read_range(where[j], j, data + b * es, b * es, len * es);
    }
    sync(next_step());  // nobody changes its tensor while a peer may still read it
  }

  // Step protocol. A rank publishes step s once it wrote its slots for s and finished reading
  // everything of step s - 1; it may read the peers' step-s slots once they published s. A
  // two-sided step (sync) waits for every peer; a one-sided one (finish_step) waits for those
  // whose data it reads, if any, so a root can run ahead. Either way a rank writes its slots of
  // parity s % 2 only after every peer published s - 1 (next_step), so nobody still reads
  // them from step s - 2.
  void publish(uint32_t s) {
    SegmentHeader* h = seg_.header(rank_);
    if (own_core_) note_cpu(h);
    h->described[s % kRingDepth] = described_;
    h->step.op[s % kSignatureDepth].store(op_, std::memory_order_relaxed);
    post(h->step, s);  // releases the description and the signature with the step
  }

  // Records the CPU this rank runs on in its header when it changed (for peer_on_my_cpu).
  void note_cpu(SegmentHeader* h) {
    const int cpu = ::sched_getcpu();
    if (cpu == cpu_) return;
    cpu_ = cpu;
    h->cpu.store(cpu, std::memory_order_relaxed);
  }

  // Whether rank r last published a step from the CPU this thread runs on (tracked only while
  // every rank has a core; otherwise waits barely spin anyway). Spinning for it then only
  // keeps it from running: with two ranks on one CPU (taskset, or the scheduler packing them
  // while another program runs) every wait spun its full 200 us before it yielded (2 ranks
  // on CPU 0: all_gather of 4 B 209 us a call).
  bool peer_on_my_cpu(int r) const {
    return own_core_ &&
           seg_.header(r)->cpu.load(std::memory_order_relaxed) == ::sched_getcpu();
  }

  // Whether rank r was pinned to this rank's CPU (cpu_group_). While the host keeps the vCPUs
  // far apart the slots take streaming stores, which send every line to memory; a line only a
  // rank on this CPU reads is better left in the caches they share. 4 ranks on 2 CPUs, far
  // apart, all_reduce medians over 5 alternating launches, plain stores for those pieces
  // against streaming ones: 4 MiB 1025-1273 us against 1082-1329 (faster in 5 of 5), 1 MiB
  // 265-291 against 276-303 (5 of 5).
  bool shares_cpu(int r) const {
    return cpu_group_ >= 0 && r % seg_.cpus() == cpu_group_;
  }

  // The shape every rank must give the collective about to run (count in elements of dtype,
  // or in bytes without one); it becomes part of every step's signature.
  void expect(size_t count, std::optional<DType> dtype = std::nullopt, int root = -1,
              std::optional<ReduceOp::Kind> reduce = std::nullopt) {
    described_.count = count;
    described_.dtype = dtype ? static_cast<uint8_t>(*dtype) : StepDescription::kBytes;
    described_.root = root;
    described_.reduce = reduce ? static_cast<uint8_t>(*reduce) : StepDescription::kNoReduce;
    op_ = signature(described_);
    copy_shared.select(dtype ? count * core::element_size(*dtype) : count, agreed_mode_);
  }

  // The same for a collective that moves `bytes` of `dtype` without computing on them: the
  // dtype is checked too, although only the bytes matter here (a float32 tensor on one rank and
  // an int32 one on another would be reinterpreted otherwise).
  void expect_moved(size_t bytes, DType dtype, int root = -1) {
    expect(bytes / core::element_size(dtype), dtype, root);
  }

  // 32 bits for the step word: the OpType and a 24-bit hash of everything else.
  static uint32_t signature(const StepDescription& d) {
    uint64_t h = d.seq * 0x9e3779b97f4a7c15ULL;
    h ^= (d.count + 0x632be59bd9b4e019ULL) * 0xbf58476d1ce4e5b9ULL;
    h ^= (static_cast<uint64_t>(static_cast<uint32_t>(d.root)) << 16 |
          static_cast<uint64_t>(d.dtype) << 8 | d.reduce) * 0x94d049bb133111ebULL;
    h ^= h >> 31;
    h *= 0xd6e8feb86659fd93ULL;
    h ^= h >> 32;
    return static_cast<uint32_t>(h << 8) | d.type;
  }

  static std::string shape_text(const StepDescription& d) {
    std::string text =
        d.dtype == StepDescription::kBytes
            ? str_cat(d.count, " bytes")
            : str_cat(d.count, " elements of ",
                      core::dtype_name(static_cast<DType>(d.dtype)));
    if (d.root >= 0) text += str_cat(", root ", d.root);
    if (d.reduce != StepDescription::kNoReduce) {
      text += str_cat(", ", ReduceOp(static_cast<ReduceOp::Kind>(d.reduce)).name());
    }
    return text;
  }

  static std::string description_text(const StepDescription& d) {
    return str_cat(core::op_type_name(static_cast<OpType>(d.type)), " (sequence ", d.seq,
                   ") on ", shape_text(d));
  }

  // Peer r published step s for this operation with the same shape. Otherwise the ranks
  // issued different collectives, or in a different order, or with different sizes, dtypes,
  // roots or reductions: fail naming both sides. Valid while this rank has not published
  // s + 1: r cannot reuse the entry (s + kRingDepth) before that. The signature on the step
  // word's line decides at once unless r ran kSignatureDepth steps further and replaced it.
  void check_same_op(int r, uint32_t s) { check_peer_ran(r, s, described_, op_, false); }

  // Fails unless peer r ran `ours` (signature `sig`) at step s, as check_same_op; `as_root`
  // when this rank sent step s earlier as the root of a one-sided operation.
  void check_peer_ran(int r, uint32_t s, const StepDescription& ours, uint32_t sig,
                      bool as_root) {
    const SegmentHeader* h = seg_.header(r);
    if (h->step.op[s % kSignatureDepth].load(std::memory_order_relaxed) == sig) return;
    const StepDescription theirs = h->described[s % kRingDepth];
    if (theirs == ours) return;
    fail<DistBackendError>(str_cat(
        describe(), ": rank ", r,
        as_root ? " ran " : " runs ", description_text(theirs),
        as_root ? " at the step where this rank, as its root, ran "
                : " at this step while this rank runs ",
        description_text(ours), "; every rank must issue the same collectives in the same "
        "order, with the same sizes, dtypes, roots and reductions"));
  }

  // The root of a one-sided broadcast or scatter waits for nobody, so a mismatch there (every
  // rank naming itself as the root, say) would pass unseen: such a step is checked against
  // every peer's once they are seen past it (sync, one_shot_mailbox, next_step). One at a
  // time, the earliest: in a loop of them a rank ahead of its peers still finds one they
  // passed.
  void sent_unchecked(uint32_t s) {
    if (has_unchecked_) return;
    unchecked_ = s;
    unchecked_op_ = op_;
    unchecked_described_ = described_;
    has_unchecked_ = true;
  }

  // Checks the step of sent_unchecked against the peers seen past it; forgets it once every
  // peer passed it, or when the peers' records of it may be gone.
  void check_unchecked() {
    if (!has_unchecked_) return;
    bool all_checked = true;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      const uint32_t seen = seg_.header(r)->step.value.load(std::memory_order_acquire);
      if (!reached(seen, unchecked_)) {
        all_checked = false;
        continue;
      }
      // Rank r keeps step s's description until it publishes s + kRingDepth.
      if (seen - unchecked_ >= kRingDepth - 1) continue;
      check_peer_ran(r, unchecked_, unchecked_described_, unchecked_op_, true);
    }
    if (all_checked || step_ - unchecked_ >= kRingDepth - 1) has_unchecked_ = false;
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
  uint32_t next_step(bool small = false, bool one_sided = false) {
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
      check_unchecked();
    }
    return s;
  }

  // Whether a step moving `bytes` per rank fits a ring entry, and rank r's entry (or its
  // parity slot) for step s.
  static bool fits_ring(size_t bytes) { return bytes <= kRingBytes; }
  char* slot(int r, uint32_t s, bool small) const {
    return small ? seg_.ring(r, s) : seg_.in(r, s);
  }

  void sync(uint32_t s) {
    const bool time_trips = placement_due();
    if (time_trips) {  // published with the step
      std::atomic<uint64_t>& word = seg_.header(0)->placement;
      word.store((word.load(std::memory_order_relaxed) & ~kStepBits) | s,
                 std::memory_order_relaxed);
    }
    publish(s);
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) wait_peer(r, s);
    }
    step_ = s;
    all_reached_ = s;
    check_unchecked();
    if (watching_) watch_placement(s, time_trips);
  }

  // The host moves the vCPUs between placements every few minutes, and in the slow one plain
  // stores into lines a peer reads cost several times what they cost in the fast one (see
  // SharedWriter). The probes of each kind of operation notice only after it ran for a while,
  // so rank 0 also times a cache line's round trip with rank 1 after a two-sided step every
  // kPlacementPeriodNs (a few microseconds), and tells every rank through its placement word
  // whether the vCPUs are far apart (SharedWriter::placement_changed). Ranks that share
  // cores are pinned to CPUs in turn (Segment::bind_cpu), so ranks 0 and 1 run on different
  // ones, but rank 1 may not be running to answer: with 4 ranks on 2 cores 16 of 26 timings
  // got an answer in time, and the others cost rank 0 kPlacementGiveUpNs.
  bool placement_due() {
    if (!watching_ || rank_ != 0 || (++syncs_ & 15) != 0) return false;
    if (now_ns() < next_placement_ns_) return false;
    next_placement_ns_ = now_ns() + kPlacementPeriodNs;
    return !own_core_ || seg_.header(1)->cpu.load(std::memory_order_relaxed) != cpu_;
  }

  // After two-sided step s: rank 0 times the round trips if it asked for them (`time_trips`),
  // rank 1 answers when asked, and every rank follows rank 0's verdict.
  void watch_placement(uint32_t s, bool time_trips) {
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
  int64_t round_trip(uint32_t s, int peer, bool leading) {
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

  void set_placement(bool far) {
    if (far == far_) return;
    far_ = far;
    copy_shared.placement_changed(far);
    if (core::log_enabled(core::LogLevel::kDebug)) {
      core::log(core::LogLevel::kDebug,
                str_cat(describe(), ": the vCPUs are ", far ? "far apart" : "close",
                        " now; the copies into shared lines use ", far ? "streaming" : "plain",
                        " stores"));
    }
  }

  void finish_step(uint32_t s) {
    publish(s);
    step_ = s;
    claim_next_mailbox();
  }

  std::vector<int> not_arrived(uint32_t s) const {
    std::vector<int> missing;
    for (int r = 0; r < size_; ++r) {
      if (!reached(seg_.header(r)->step.value.load(std::memory_order_acquire), s)) {
        missing.push_back(r);
      }
    }
    return missing;
  }

  // Waits until peer r published step s of this operation.
  void wait_peer(int r, uint32_t s) {
    await_step(r, s);
    check_same_op(r, s);
  }

  // Waits until peer r published step s (of whatever operation); returns the step seen.
  uint32_t await_step(int r, uint32_t s) {
    FutexWord& w = seg_.header(r)->step;
    uint32_t seen = w.value.load(std::memory_order_acquire);
    if (reached(seen, s)) return seen;
    // A clock read costs as much as a few dozen spins (~23 ns on this project's VMs), and most
    // waits of small operations end sooner: look at the clock only after those (none when
    // ranks outnumber cores: spinning then only delays the rank being waited for).
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

  // A rank still waiting here says so (the step it is in and its operation's signature), and
  // fails if one of the ranks it waits for is blocked in the same step in another operation:
  // then neither can go on (e.g. both are the root of a gather, each waiting for the other's
  // data), and only the timeout would end it. Ranks that did issue the same operation never
  // differ here: a step belongs to one operation on every rank.
  void check_not_waiting_for_each_other(const std::vector<int>& missing) {
    const uint64_t mine = uint64_t{in_step_} << 32 | op_;
    std::atomic<uint64_t>& blocked = seg_.header(rank_)->blocked;
    if (blocked.load(std::memory_order_relaxed) != mine) {
      blocked.store(mine, std::memory_order_release);
    }
    for (int r : missing) {
      if (r == rank_) continue;
      const uint64_t theirs = seg_.header(r)->blocked.load(std::memory_order_acquire);
      if (theirs >> 32 != in_step_ || theirs == mine) continue;
      const auto type = static_cast<OpType>(static_cast<uint8_t>(theirs));
      fail<DistBackendError>(str_cat(
          describe(), ": rank ", r, " waits in ", core::op_type_name(type), " at this step "
          "(another collective, or one with other sizes, dtypes, roots or reductions) while this "
          "rank waits for it in ", description_text(described_), "; every rank must issue the "
          "same collectives in the same order, with the same sizes, dtypes, roots and "
          "reductions"));
    }
  }

  // Throws (and marks the engine broken) when the wait for step s cannot succeed.
  void check_waiting(uint32_t s) {
    if (aborted.load()) fail<DistBackendError>(str_cat(describe(), ": the backend was shut down"));
    const std::vector<int> missing = not_arrived(s);
    // First: a peer that failed on the mismatch has shut down by now.
    check_not_waiting_for_each_other(missing);
    for (int r : missing) {
      if (r == rank_) continue;
      const std::string gone = seg_.peer_gone(r);
      if (!gone.empty()) {
        fail<DistBackendError>(str_cat(describe(), ": rank ", r, " ", gone,
                                       " while this rank waited for it"));
      }
    }
    if (deadline_.expired()) {
      std::vector<int> peers;
      for (int r : missing) {
        if (r != rank_) peers.push_back(r);
      }
      // "Timed out" between spaces, as torch's messages have it (its tests match on that).
      fail<DistTimeoutError>(str_cat(describe(), ": Timed out after ",
                                     core::format_timeout(timeout_), " waiting for rank",
                                     peers.size() == 1 ? " " : "s ", pg::join_ranks(peers)));
    }
  }

  template <typename Error>
  [[noreturn]] void fail(std::string message) {
    broken = message;
    throw Error(message);
  }

  std::shared_ptr<Segment> segment_;
  Segment& seg_;
  const int rank_;
  const int size_;
  const size_t per_core_;          // ranks per core (ranks_per_core)
  const WaitPolicy policy_;
  const bool own_core_;            // every rank has a core of its own
  const size_t direct_piece_;      // owner_computes' piece through the kernel
  const size_t direct_allreduce_;  // allreduce of ordinary tensors goes direct from this size
  const size_t small_chunk_;       // the pipelined allreduce's chunk unless kModeLargeChunks
  const int64_t far_trip_ns_;      // watch_placement's verdict: far apart from this round trip
  SharedWriter copy_shared;
  // With more ranks than CPUs, ranks pinned by Segment::bind_cpu run rank r on the
  // (r mod CPUs)-th CPU: the ranks whose r mod CPUs is cpu_group_ share this rank's CPU (and
  // its caches). -1 when the ranks have a core each or were not pinned by us.
  const int cpu_group_;
  int cpu_ = -1;              // the CPU in this rank's header (note_cpu)
  uint32_t step_ = 0;         // last step this rank completed
  uint32_t sealed_step_ = 0;  // the step whose mailbox this rank last sealed ...
  size_t sealed_bytes_ = 0;   // ... with this many bytes; 0 once claim_next_mailbox ran
  uint32_t in_step_ = 0;      // the step this rank works in (opened by next_step)
  uint32_t all_reached_ = 0;  // a step every peer is known to have published
  // sent_unchecked: a step this rank sent as a one-sided root, not yet checked.
  bool has_unchecked_ = false;
  uint32_t unchecked_ = 0;
  uint32_t unchecked_op_ = 0;
  StepDescription unchecked_described_;
  // The mode of the next pipelined allreduce (kModeStreaming, kModeLargeChunks), agreed in
  // the previous one (see pipelined).
  int agreed_mode_ = 0;
  // Whether the parity slots were read after their step was published (not one-sided):
  // bit 0 for the last step opened, bit 1 for the one before (next_step).
  uint32_t two_sided_ = 3;
  // watch_placement: rank 0's placement word (the step of its next round trips, whether the
  // vCPUs are far apart, whether it timed any round trip yet), whether it runs (set by
  // calibrate), the verdict this rank follows, whether rank 0 timed round trips, when rank 0
  // times the next ones, and its two-sided steps so far.
  static constexpr uint64_t kStepBits = 0xffffffff;
  static constexpr uint64_t kFarBit = uint64_t{1} << 32;
  static constexpr uint64_t kTimedBit = uint64_t{1} << 33;
  bool watching_ = false;
  bool far_ = false;
  bool located_far_ = false;  // rank 0's far_ as the last locate() handed it out
  int64_t next_placement_ns_ = 0;
  uint32_t syncs_ = 0;
  // Per-operation buffers kept between operations, so that collectives do not allocate.
  // owner_computes' landing area for pieces read through the kernel; pipelined's for a piece
  // only the peers need (streaming stores)
  std::vector<char> scratch_;
  std::vector<Where> where_;   // locate()
  std::vector<const void*> sources_;  // reduce_sources' operands
  std::vector<size_t> incoming_;  // alltoall: bytes each peer sends this rank
  std::vector<const char*> equal_send_;  // alltoall_equal's parts
  std::vector<char*> equal_recv_;
  std::vector<size_t> equal_lens_;
  const char* name_ = "";
  uint64_t seq_ = 0;
  StepDescription described_;  // the running operation (begin, expect)
  uint32_t op_ = 0;            // signature(described_)
  Millis timeout_{0};
  core::Deadline deadline_{Millis(0)};  // set by the operation's first long wait
  bool deadline_started_ = false;
};

// ---------------------------------------------------------------------------------------------
// P2PEngine: messages through the per-pair channels. Progress happens whenever any
// point-to-point operation of this rank is posted or waited on, so sends and receives in any
// order cannot deadlock: data that arrives before its receive is posted is buffered.

struct P2POp {
  bool is_send = false;
  int peer = -1;  // -1: any source
  int tag = 0;
  char* data = nullptr;
  size_t bytes = 0;
  size_t done = 0;
  bool started = false;
  bool finished = false;  // guarded by the engine's mutex
  int source = -1;
  std::exception_ptr error;
  std::weak_ptr<core::Work> work;
  Tensor tensor;
  core::Deadline deadline{Millis(0)};
  Millis timeout{0};
  std::string description;
};

class P2PEngine {
 public:
  P2PEngine(std::shared_ptr<Segment> segment, std::shared_ptr<Engine> engine)
      : segment_(std::move(segment)),
        seg_(*segment_),
        engine_(std::move(engine)),
        rank_(seg_.rank()),
        size_(seg_.size()),
        sends_(size_),
        incoming_(size_) {}

  void post(const std::shared_ptr<P2POp>& op) {
    std::vector<std::shared_ptr<P2POp>> done;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (op->is_send) {
        sends_[op->peer].push_back(op);
      } else if (!claim_unexpected(op, done)) {
        recvs_.push_back(op);
      }
      progress(done);
    }
    complete(done);
  }

  // Whether a receive is posted and not complete (another thread may be writing its buffer).
  bool receiving() {
    std::lock_guard<std::mutex> lock(mutex_);
    return !recvs_.empty();
  }

  // Drives progress until `op` finishes, its deadline passes (the op fails) or the caller's
  // timeout passes (throws, the op stays pending).
  void wait(const std::shared_ptr<P2POp>& op, Millis caller_timeout) {
    const core::Deadline caller(caller_timeout);
    FutexWord& bell = seg_.header(rank_)->doorbell;
    const int64_t spin_until = now_ns() + engine_->policy().spin_ns;
    const int64_t yield_until = spin_until + engine_->policy().yield_ns;
    int64_t last_check = 0;
    for (;;) {
      const uint32_t v = bell.value.load(std::memory_order_seq_cst);
      std::vector<std::shared_ptr<P2POp>> done;
      bool finished;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        progress(done);
        finished = op->finished;
      }
      complete(done);
      if (finished) return;
      const int64_t now = now_ns();
      if (now < spin_until) {
        cpu_relax();
        continue;
      }
      if (now - last_check >= kCheckNs) {
        last_check = now;
        std::string why;
        bool timed_out = false;
        if (engine_->aborted.load()) {
          why = "the backend was shut down";
        } else if (op->peer >= 0) {
          if (std::string gone = seg_.peer_gone(op->peer); !gone.empty()) {
            why = str_cat("rank ", op->peer, " ", gone);
          }
        } else {
          std::vector<int> gone;
          for (int r = 0; r < size_; ++r) {
            if (r != rank_ && !seg_.peer_gone(r).empty()) gone.push_back(r);
          }
          if (static_cast<int>(gone.size()) == size_ - 1) {
            why = str_cat("every other rank is gone (", pg::join_ranks(gone), ")");
          }
        }
        if (why.empty() && op->deadline.expired()) {
          why = str_cat("Timed out after ", core::format_timeout(op->timeout));
          timed_out = true;
        }
        if (!why.empty()) {
          const std::string message = str_cat("shm ", op->description, " ", why);
          fail(op, timed_out ? std::make_exception_ptr(DistTimeoutError(message))
                             : std::make_exception_ptr(DistBackendError(message)));
          return;
        }
        if (caller.expired()) {
          throw DistTimeoutError(str_cat("shm ", op->description, " did not complete within ",
                                         core::format_timeout(caller_timeout),
                                         " (it is still pending)"));
        }
      }
      if (now < yield_until) {
        ::sched_yield();
        continue;
      }
      bell.waiters.fetch_add(1, std::memory_order_seq_cst);
      if (bell.value.load(std::memory_order_seq_cst) == v) futex_wait(&bell.value, v, kSleepNs);
      bell.waiters.fetch_sub(1, std::memory_order_relaxed);
    }
  }

 private:
  struct Unexpected {
    int src = -1;
    int tag = 0;
    std::vector<char> data;
    size_t got = 0;
    bool complete = false;
    std::shared_ptr<P2POp> claimed;  // a receive waiting for the rest of this message
  };
  struct Incoming {
    std::shared_ptr<P2POp> op;           // the receive it lands in, or
    std::shared_ptr<Unexpected> buffer;  // the buffer holding it until one is posted
    bool discard = false;
  };

  static bool matches(const P2POp& op, int src, int tag) {
    return (op.peer < 0 || op.peer == src) && op.tag == tag;
  }

  // Expects mutex_ held. Takes the oldest buffered message that `op` accepts.
  bool claim_unexpected(const std::shared_ptr<P2POp>& op,
                        std::vector<std::shared_ptr<P2POp>>& done) {
    for (auto it = unexpected_.begin(); it != unexpected_.end(); ++it) {
      auto& u = **it;
      if (u.claimed || !matches(*op, u.src, u.tag)) continue;
      if (u.complete) {
        deliver(*op, u);
        unexpected_.erase(it);
        done.push_back(op);
      } else {
        u.claimed = op;
      }
      return true;
    }
    return false;
  }

  void deliver(P2POp& op, const Unexpected& u) {
    op.source = u.src;
    if (u.data.size() != op.bytes) {
      op.error = std::make_exception_ptr(DistBackendError(
          str_cat("shm ", op.description, ": rank ", u.src, " sent ", u.data.size(),
                  " bytes for a receive of ", op.bytes, " bytes")));
    } else {
      copy(op.data, u.data.data(), op.bytes);
    }
    op.finished = true;
  }

  // Expects mutex_ held. Moves every channel as far as it goes without waiting.
  void progress(std::vector<std::shared_ptr<P2POp>>& done) {
    for (int d = 0; d < size_; ++d) {
      auto& queue = sends_[d];
      while (!queue.empty()) {
        P2POp& op = *queue.front();
        ChannelCtrl* ch = seg_.channel(rank_, d);
        const uint32_t posted = ch->posted.load(std::memory_order_relaxed);
        if (ch->consumed.load(std::memory_order_acquire) != posted) break;  // slot busy
        const size_t len = std::min(kChannelBytes, op.bytes - op.done);
        copy_shared(seg_.channel_data(rank_, d), op.data + op.done, len);
        ch->tag = op.tag;
        ch->bytes = static_cast<uint32_t>(len);
        ch->total = op.bytes;
        ch->offset = op.done;
        ch->posted.store(posted + 1, std::memory_order_release);
        ring(seg_.header(d)->doorbell);
        op.done += len;
        op.started = true;
        if (op.done == op.bytes) {
          op.finished = true;
          done.push_back(queue.front());
          queue.pop_front();
        }
      }
    }
    for (int src = 0; src < size_; ++src) {
      if (src == rank_) continue;
      ChannelCtrl* ch = seg_.channel(src, rank_);
      for (;;) {
        const uint32_t consumed = ch->consumed.load(std::memory_order_relaxed);
        if (ch->posted.load(std::memory_order_acquire) == consumed) break;
        const int tag = ch->tag;
        const size_t len = ch->bytes;
        const size_t total = ch->total;
        const size_t offset = ch->offset;
        const char* data = seg_.channel_data(src, rank_);
        Incoming& in = incoming_[src];
        if (offset == 0) {
          in = Incoming{};
          for (auto it = recvs_.begin(); it != recvs_.end(); ++it) {
            if (!matches(**it, src, tag)) continue;
            in.op = *it;
            recvs_.erase(it);
            break;
          }
          if (in.op) {
            in.op->source = src;
            if (in.op->bytes != total) {
              in.op->error = std::make_exception_ptr(DistBackendError(
                  str_cat("shm ", in.op->description, ": rank ", src, " sent ", total,
                          " bytes for a receive of ", in.op->bytes, " bytes")));
              in.discard = true;
            }
          } else {
            in.buffer = std::make_shared<Unexpected>();
            in.buffer->src = src;
            in.buffer->tag = tag;
            in.buffer->data.resize(total);
            unexpected_.push_back(in.buffer);
          }
        }
        if (in.op && !in.discard) {
          copy(in.op->data + offset, data, len);
        } else if (in.buffer) {
          copy(in.buffer->data.data() + offset, data, len);
        }
        ch->consumed.store(consumed + 1, std::memory_order_release);
        ring(seg_.header(src)->doorbell);
        if (offset + len < total) continue;
        if (in.op) {
          if (!in.op->finished) {
            in.op->finished = true;
            done.push_back(in.op);
          }
        } else if (in.buffer) {
          in.buffer->complete = true;
          if (auto claimed = in.buffer->claimed) {
            deliver(*claimed, *in.buffer);
            unexpected_.erase(std::find(unexpected_.begin(), unexpected_.end(), in.buffer));
            done.push_back(claimed);
          }
        }
        in = Incoming{};
      }
    }
  }

  // Fails `op` (deadline, dead peer) and forgets it.
  void fail(const std::shared_ptr<P2POp>& op, std::exception_ptr error) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (op->finished) return;
      op->finished = true;
      op->error = error;
      if (op->is_send) {
        auto& q = sends_[op->peer];
        if (auto it = std::find(q.begin(), q.end(), op); it != q.end()) q.erase(it);
      } else {
        if (auto it = std::find(recvs_.begin(), recvs_.end(), op); it != recvs_.end()) {
          recvs_.erase(it);
        }
        for (auto& u : unexpected_) {
          if (u->claimed == op) u->claimed.reset();
        }
        for (auto& in : incoming_) {
          if (in.op == op) in.discard = true;
        }
      }
    }
    complete({op});
  }

  static void complete(const std::vector<std::shared_ptr<P2POp>>& ops) {
    for (const auto& op : ops) {
      auto work = op->work.lock();
      if (!work) continue;
      try {
        if (!op->is_send && op->source >= 0) work->set_source_rank(op->source);
        if (op->error) {
          work->finish_with_error(op->error);
        } else {
          work->finish({op->tensor});
        }
      } catch (...) {
        // completed already
      }
    }
  }

  std::shared_ptr<Segment> segment_;
  Segment& seg_;
  std::shared_ptr<Engine> engine_;
  const int rank_;
  const int size_;
  std::mutex mutex_;
  SharedWriter copy_shared;  // guarded by mutex_
  std::vector<std::deque<std::shared_ptr<P2POp>>> sends_;  // per destination; guarded by mutex_
  std::deque<std::shared_ptr<P2POp>> recvs_;                // posted, unmatched; guarded by mutex_
  std::deque<std::shared_ptr<Unexpected>> unexpected_;      // arrival order; guarded by mutex_
  std::vector<Incoming> incoming_;                          // per source; guarded by mutex_
};

namespace {

// A send or receive: wait() drives the channels until it completes.
class P2PWork : public core::Work {
 public:
  P2PWork(OpType type, std::string description, std::shared_ptr<P2PEngine> engine,
          std::shared_ptr<P2POp> op)
      : Work(type, std::move(description)), engine_(std::move(engine)), op_(std::move(op)) {}

  bool wait(Millis timeout) override {
    if (!is_completed()) engine_->wait(op_, timeout);
    return Work::wait(core::kNoTimeout);
  }

  bool progresses_in_wait() const override { return true; }

 private:
  std::shared_ptr<P2PEngine> engine_;
  std::shared_ptr<P2POp> op_;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// ShmBackend

// Operations run one at a time and in submission order: by the caller (synchronous ones with
// nothing queued before them), by the worker thread, or by a caller that waits for an
// asynchronous one still queued (QueuedWork). `running` says one of them is executing: whoever
// sets it has the Engine to itself until finished_one.
//
// Waking the sleeping worker for every asynchronous operation costs more than the operation
// (a futex wake-up of an idle vCPU, 5-10 us here, which also takes a core from the other
// ranks), and usually the caller waits for it soon after and runs it itself. So while
// asynchronous operations are in use (kPollWindow since the last one) the worker polls the
// queue every kPoll instead of being woken: an operation nobody waits for still starts within
// kPoll. After that it sleeps until woken, and submit() wakes it then.
struct ShmBackend::Queue {
  static constexpr std::chrono::microseconds kPoll{1000};
  static constexpr std::chrono::milliseconds kPollWindow{200};

  std::mutex mutex;
  std::condition_variable wake;
  std::deque<Task> tasks;  // guarded by mutex
  size_t pending = 0;      // queued or running operations; guarded by mutex
  uint64_t next_seq = 0;   // guarded by mutex
  bool running = false;    // guarded by mutex
  bool stopping = false;   // guarded by mutex
  bool deep_sleep = false;  // the worker waits to be woken; guarded by mutex
  std::weak_ptr<core::Work> last;  // the latest submitted operation; guarded by mutex
  std::chrono::steady_clock::time_point last_async{};  // guarded by mutex
};

// An operation's Work whose wait() runs the operation itself when it is still queued and no
// other operation runs, instead of blocking until the worker thread wakes up for it: a
// thread hand-off costs 10-100 us on these machines, the operation itself a few. Waits on
// its future (and on futures chained to it) do the same: while asynchronous operations are
// in use the worker only polls the queue (see Queue), and DDP's reducer, which waits on its
// buckets' futures, took 1.1 ms per backward pass for a bucket of 1 KiB before they did.
class ShmBackend::QueuedWork : public core::Work {
 public:
  QueuedWork(OpType type, std::string description, std::weak_ptr<Queue> queue,
             std::weak_ptr<Engine> engine, uint64_t seq, Millis op_timeout)
      : core::Work(type, std::move(description)) {
    get_future()->set_driver([queue = std::move(queue), engine = std::move(engine), seq,
                              op_timeout](Millis timeout) {
      // A waiter with a shorter timeout only waits: running the operation here would bind it
      // to the waiter's deadline, while it must keep running past it.
      if (timeout > core::kNoTimeout && timeout < op_timeout) return;
      const std::shared_ptr<Queue> q = queue.lock();
      const std::shared_ptr<Engine> e = engine.lock();
      if (q && e) run_queued_until(*q, *e, seq);
    });
  }
};

ShmBackend::ShmBackend(std::shared_ptr<store::Store> store, int rank, int size, ShmOptions opts)
    : pg::Backend(rank, size, opts.timeout),
      store_(std::move(store)),
      queue_(std::make_shared<Queue>()) {
  size_t heap = opts.heap_bytes;
  if (heap == 0) heap = static_cast<size_t>(core::env_int(core::kEnvShmHeapBytes));
  const Millis rendezvous_timeout =
      opts.timeout > Millis::zero() ? opts.timeout : store_->timeout();
  segment_ = std::make_shared<Segment>(*store_, rank, size, heap, rendezvous_timeout);
  const int cpu = segment_->bind_cpu();
  if (cpu >= 0 && core::log_enabled(core::LogLevel::kDebug)) {
    core::log(core::LogLevel::kDebug, str_cat("shm rank ", rank, " of ", size, ": ", size,
                                              " ranks share ", segment_->cpus(),
                                              " CPUs, pinned to cpu ", cpu, " (C10D_SHM_BIND)"));
  }
  engine_ = std::make_shared<Engine>(segment_, cpu >= 0);
  engine_->calibrate(rendezvous_timeout);  // before any operation can be submitted
  p2p_ = std::make_shared<P2PEngine>(segment_, engine_);
}

ShmBackend::~ShmBackend() { shutdown(); }

uint64_t ShmBackend::next_sequence() const {
  std::lock_guard<std::mutex> lock(queue_->mutex);
  return queue_->next_seq;
}

std::optional<bool> ShmBackend::cpus_far_apart() const { return engine_->far_apart(); }

namespace {

// The bytes of a C-contiguous tensor of `sizes` and `dtype` (InvalidArgument for a negative
// size).
size_t tensor_bytes(const std::vector<int64_t>& sizes, DType dtype) {
  int64_t numel = 1;
  for (int64_t s : sizes) {
    C10D_CHECK_ARG(s >= 0, "shm_empty: negative size ", s);
    numel *= s;
  }
  return static_cast<size_t>(numel) * core::element_size(dtype);
}

// The tensor on rank `rank`'s heap block [offset, offset + bytes), which it gives back when
// the last view of it goes.
Tensor heap_tensor(const std::shared_ptr<Segment>& segment, int rank, size_t offset,
                   size_t bytes, std::vector<int64_t> sizes, DType dtype) {
  char* data = segment->heap(rank) + offset;
  std::shared_ptr<void> owner(data, [segment, offset, bytes](void*) {
    segment->own_heap().release(offset, bytes);
  });
  return Tensor(data, dtype, std::move(sizes), {}, std::move(owner));
}

}  // namespace

Tensor ShmBackend::empty(std::vector<int64_t> sizes, DType dtype) {
  const size_t bytes = tensor_bytes(sizes, dtype);
  const size_t offset = segment_->own_heap().allocate(bytes);
  return heap_tensor(segment_, rank(), offset, bytes, std::move(sizes), dtype);
}

bool ShmBackend::in_shared_heap(const void* data, size_t bytes) const {
  return segment_->heap_offset(data, bytes) >= 0;
}

ShmBackend::Adoption ShmBackend::adopt(void* data, size_t bytes) {
  // Without cross-memory attach the bytes outside the whole pages could not be reached, so
  // the backend would never use the alias.
  if (!segment_->cma()) return Adoption::kRefused;
  // The worker thread, a thread waiting on a receive, or a peer may write into the buffer for
  // an operation in flight, and a write between the copy and the remapping would be lost:
  // adopt only while none is.
  std::lock_guard<std::mutex> lock(queue_->mutex);
  if (queue_->stopping) return Adoption::kRefused;
  if (queue_->pending != 0 || p2p_->receiving()) return Adoption::kBusy;
  return adopt_into_heap(segment_, data, bytes) ? Adoption::kDone : Adoption::kRefused;
}

bool ShmBackend::aliased(const void* data, size_t bytes) const {
  const AliasedPart part = find_alias(*segment_, data, bytes);
  return part.hi > part.lo;
}

std::optional<Tensor> ShmBackend::empty_for_collectives(const std::vector<int64_t>& sizes,
                                                        DType dtype) {
  const size_t bytes = tensor_bytes(sizes, dtype);
  const std::optional<size_t> offset = segment_->own_heap().try_allocate(bytes);
  if (!offset) return std::nullopt;  // the heap is full: the caller takes plain memory
  return heap_tensor(segment_, rank(), *offset, bytes, sizes, dtype);
}

WorkPtr ShmBackend::submit(OpType type, const char* name, Millis timeout, bool async, Body body,
                           std::vector<Tensor> outputs) {
  Task task;
  task.name = name;
  task.type = type;
  task.body = std::move(body);
  task.outputs = std::move(outputs);
  task.timeout = effective_timeout(timeout);
  Queue& q = *queue_;
  bool inline_run = false;
  {
    std::unique_lock<std::mutex> lock(q.mutex);
    task.seq = q.next_seq++;
    task.work = std::make_shared<QueuedWork>(
        type, std::string("shm:") + name + "#" + std::to_string(task.seq), queue_, engine_,
        task.seq, task.timeout);
    if (q.stopping) {
      lock.unlock();
      task.work->finish_with_error(std::make_exception_ptr(DistBackendError(
          str_cat("shm ", name, " (sequence ", task.seq, ", rank ", rank(), " of ", size(),
                  "): the backend was shut down"))));
      return task.work;
    }
    ++q.pending;
    q.last = task.work;
    if (!async && q.pending == 1) {
      // Nothing queued before it: run here, without a thread hand-off.
      inline_run = true;
      q.running = true;
    } else {
      if (!worker_.joinable()) worker_ = std::thread(worker_loop, queue_, engine_);
      if (async) q.last_async = std::chrono::steady_clock::now();
      const bool wake = q.deep_sleep;  // else the worker polls (see Queue)
      WorkPtr work = task.work;
      q.tasks.push_back(std::move(task));
      lock.unlock();
      if (wake) q.wake.notify_one();
      return work;
    }
  }
  if (inline_run) run_task(*engine_, task);
  finished_one(q);
  return task.work;
}

void ShmBackend::finished_one(Queue& q) {
  bool more;
  {
    std::lock_guard<std::mutex> lock(q.mutex);
    --q.pending;
    q.running = false;
    more = !q.tasks.empty() && q.deep_sleep;
  }
  // Wake the worker only for work, and only when it does not poll (see Queue): a waiter
  // usually runs the next operation itself.
  if (more) q.wake.notify_one();
}

void ShmBackend::run_queued_until(Queue& q, Engine& engine, uint64_t seq) {
  for (;;) {
    Task task;
    {
      std::lock_guard<std::mutex> lock(q.mutex);
      if (q.running || q.stopping || q.tasks.empty() || q.tasks.front().seq > seq) return;
      task = std::move(q.tasks.front());
      q.tasks.pop_front();
      q.running = true;
    }
    run_task(engine, task);
    finished_one(q);
    if (task.seq == seq) return;
  }
}

void ShmBackend::run_task(Engine& engine, Task& task) noexcept {
  std::exception_ptr error;
  try {
    engine.begin(task.name, task.type, task.seq, task.timeout);
    task.body(engine);
    engine.end();
  } catch (...) {
    error = std::current_exception();
  }
  try {
    if (error) {
      task.work->finish_with_error(error);
    } else {
      task.work->finish(std::move(task.outputs));
    }
  } catch (...) {
    // shutdown() failed it already
  }
}

void ShmBackend::worker_loop(std::shared_ptr<Queue> queue, std::shared_ptr<Engine> engine) {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(queue->mutex);
      for (;;) {
        if (queue->stopping) return;  // shutdown() failed what was queued
        if (!queue->tasks.empty() && !queue->running) break;
        if (std::chrono::steady_clock::now() - queue->last_async < Queue::kPollWindow) {
          queue->wake.wait_for(lock, Queue::kPoll);
        } else {
          queue->deep_sleep = true;
          queue->wake.wait(lock);
          queue->deep_sleep = false;
        }
      }
      task = std::move(queue->tasks.front());
      queue->tasks.pop_front();
      queue->running = true;
    }
    run_task(*engine, task);
    finished_one(*queue);
  }
}

void ShmBackend::finish_pending(Millis timeout) {
  // Operations run in order, so waiting for the last one submitted (queued or running)
  // waits for all.
  Queue& q = *queue_;
  WorkPtr last;
  {
    std::lock_guard<std::mutex> lock(q.mutex);
    if (!q.stopping) last = q.last.lock();
  }
  if (!last || last->is_completed()) return;
  try {
    last->wait(timeout);
  } catch (const DistTimeoutError&) {
    if (last->is_completed()) return;  // the operation's own timeout: its error says so
    core::log(core::LogLevel::kWarning,
              str_cat("shm rank ", rank(), " of ", size(), ": operations up to ",
                      last->description(), " did not finish within ",
                      core::format_timeout(timeout), " while the backend shut down; they fail"));
  } catch (...) {
    // Its error is the caller's to see; what is still queued is dropped by shutdown().
  }
}

void ShmBackend::shutdown() {
  std::lock_guard<std::mutex> shutdown_lock(shutdown_mutex_);
  Queue& q = *queue_;
  std::deque<Task> dropped;
  std::thread worker;
  {
    std::lock_guard<std::mutex> lock(q.mutex);
    if (q.stopping) return;
    q.stopping = true;
    dropped.swap(q.tasks);
    q.pending -= dropped.size();
    worker = std::move(worker_);
  }
  engine_->aborted.store(true);
  // Peers blocked on this rank fail at once instead of at their timeout.
  segment_->header(rank())->closed.store(1, std::memory_order_release);
  q.wake.notify_all();
  for (Task& task : dropped) {
    try {
      task.work->finish_with_error(std::make_exception_ptr(DistBackendError(
          str_cat("shm ", task.name, " (sequence ", task.seq, ", rank ", rank(), " of ", size(),
                  "): the backend was shut down before it ran"))));
    } catch (...) {
    }
  }
  // A running operation notices `aborted` within a few milliseconds.
  if (worker.joinable()) worker.join();
  // Adopted arrays keep their shared pages (and so the segment) until they are freed: moving
  // them back now would lose what other threads write into them meanwhile (alias.h).
}

// ---------------------------------------------------------------------------------------------
// Collectives

WorkPtr ShmBackend::broadcast(std::vector<Tensor>& tensors, const pg::BroadcastOptions& opts) {
  const int root = static_cast<int>(opts.root_rank);
  const size_t root_tensor = static_cast<size_t>(opts.root_tensor);
  return submit(
      OpType::kBroadcast, "broadcast", opts.timeout, wants_async(opts),
      [tensors, root, root_tensor](Engine& e) {
        const Tensor& source = tensors[root_tensor];
        e.broadcast(source.data_as<char>(), source.nbytes(), source.dtype(), root);
        for (size_t i = 0; i < tensors.size(); ++i) {
          if (i != root_tensor) copy(tensors[i].data(), source.data(), source.nbytes());
        }
      },
      tensors);
}

namespace {

// Several tensors per rank: reduce them locally (each scaled for PREMUL_SUM) into one buffer.
Tensor combine_local(const std::vector<Tensor>& tensors, const ReduceOp& op) {
  const size_t n = static_cast<size_t>(tensors[0].numel());
  const DType dtype = tensors[0].dtype();
  Tensor acc = tensors[0].contiguous_copy();
  core::apply_premul(acc.data(), n, dtype, op);
  for (size_t i = 1; i < tensors.size(); ++i) {
    Tensor t = tensors[i];
    if (op.kind == ReduceOp::PREMUL_SUM) {
      t = t.contiguous_copy();
      core::apply_premul(t.data(), n, dtype, op);
    }
    core::reduce(acc.data(), t.data(), n, dtype, op);
  }
  return acc;
}

}  // namespace

WorkPtr ShmBackend::allreduce(std::vector<Tensor>& tensors, const pg::AllreduceOptions& opts) {
  const ReduceOp op = opts.reduce_op;
  return submit(
      OpType::kAllreduce, "allreduce", opts.timeout, wants_async(opts),
      [tensors, op](Engine& e) {
        const Tensor& t = tensors[0];
        const size_t n = static_cast<size_t>(t.numel());
        if (tensors.size() == 1) {
          e.allreduce(t.data_as<char>(), t.data_as<char>(), n, t.dtype(), op, -1);
          return;
        }
        Tensor acc = combine_local(tensors, op);
        e.allreduce(acc.data_as<char>(), acc.data_as<char>(), n, t.dtype(), op, -1, true);
        for (const Tensor& out : tensors) copy(out.data(), acc.data(), acc.nbytes());
      },
      tensors);
}

namespace {

const char* inline_name(OpType type) {
  switch (type) {
    case OpType::kAllreduce: return "allreduce";
    case OpType::kBroadcast: return "broadcast";
    case OpType::kReduce: return "reduce";
    case OpType::kAllgatherBase: return "allgather_base";
    case OpType::kReduceScatterBase: return "reduce_scatter_base";
    case OpType::kAlltoallBase: return "alltoall_base";
    case OpType::kGather: return "gather";
    case OpType::kScatter: return "scatter";
    case OpType::kBarrier: return "barrier";
    default: return nullptr;
  }
}

void run_inline_op(Engine& e, const pg::InlineOp& op) {
  const pg::DenseView& in = op.input;
  const pg::DenseView& out = op.output;
  const bool root = e.rank() == op.root;
  switch (op.type) {
    case OpType::kAllreduce:
      return e.allreduce(in.bytes(), in.bytes(), in.numel, in.dtype, op.reduce_op, -1);
    case OpType::kBroadcast:
      return e.broadcast(in.bytes(), in.nbytes(), in.dtype, op.root);
    case OpType::kReduce:
      return e.allreduce(in.bytes(), root ? in.bytes() : nullptr, in.numel, in.dtype,
                         op.reduce_op, op.root);
    case OpType::kAllgatherBase: {
      const size_t per = in.nbytes();
      return e.allgather(in.bytes(), per, in.dtype,
                         [&](int r) { return out.bytes() + r * per; });
    }
    case OpType::kReduceScatterBase:
      return e.reduce_scatter_flat(in.bytes(), out.bytes(), out.numel, out.dtype, op.reduce_op);
    case OpType::kAlltoallBase:
      return e.alltoall_equal(in.bytes(), out.bytes(), in.nbytes() / e.size());
    case OpType::kGather:
      return e.gather(in.bytes(), in.nbytes(), in.dtype, op.root,
                      [&](int r) { return op.list[r].bytes(); });
    case OpType::kScatter:
      return e.scatter([&](int j) { return op.list[j].bytes(); }, out.bytes(), out.nbytes(),
                       out.dtype, op.root);
    case OpType::kBarrier:
      return e.barrier();
    default:
      throw core::NotSupported(str_cat("shm: no inline ", core::op_type_name(op.type)));
  }
}

}  // namespace

bool ShmBackend::has_inline(OpType type) const { return inline_name(type) != nullptr; }

void ShmBackend::run_inline(const pg::InlineOp& op) {
  const char* name = inline_name(op.type);
  Queue& q = *queue_;
  uint64_t seq;
  {
    std::unique_lock<std::mutex> lock(q.mutex);
    if (q.stopping || q.pending != 0) {
      // Earlier asynchronous operations are queued (or the backend is shut down): queue this
      // one behind them and wait, which keeps the order and reports the state.
      lock.unlock();
      core::before_blocking();
      submit(op.type, name, op.timeout, false, [&op](Engine& e) { run_inline_op(e, op); }, {})
          ->wait();
      return;
    }
    seq = q.next_seq++;
    ++q.pending;
    q.running = true;  // the engine is this thread's until finished_one
  }
  struct Finish {
    Queue& q;
    ~Finish() { finished_one(q); }
  } finish{q};
  engine_->begin(name, op.type, seq, effective_timeout(op.timeout));
  run_inline_op(*engine_, op);
  engine_->end();
}

WorkPtr ShmBackend::reduce(std::vector<Tensor>& tensors, const pg::ReduceOptions& opts) {
  const ReduceOp op = opts.reduce_op;
  const int root = static_cast<int>(opts.root_rank);
  const Tensor tensor = tensors[static_cast<size_t>(opts.root_tensor)];
  return submit(
      OpType::kReduce, "reduce", opts.timeout, wants_async(opts),
      [tensor, op, root](Engine& e) {
        char* out = e.rank() == root ? tensor.data_as<char>() : nullptr;
        e.allreduce(tensor.data_as<char>(), out, static_cast<size_t>(tensor.numel()),
                    tensor.dtype(), op, root);
      },
      tensors);
}

WorkPtr ShmBackend::allgather_base(Tensor& output, Tensor& input,
                                   const pg::AllgatherOptions& opts) {
  return submit(
      OpType::kAllgatherBase, "allgather_base", opts.timeout, wants_async(opts),
      [output, input](Engine& e) {
        const size_t per = input.nbytes();
        e.allgather(input.data_as<char>(), per, input.dtype(),
                    [&](int r) { return output.data_as<char>() + r * per; });
      },
      {output});
}

WorkPtr ShmBackend::allgather_into_tensor_coalesced(std::vector<Tensor>& outputs,
                                                    std::vector<Tensor>& inputs,
                                                    const pg::AllgatherOptions& opts) {
  return submit(
      OpType::kAllgatherCoalesced, "allgather_into_tensor_coalesced", opts.timeout,
      wants_async(opts),
      [outputs, inputs](Engine& e) {
        for (size_t i = 0; i < inputs.size(); ++i) {
          const size_t per = inputs[i].nbytes();
          char* out = outputs[i].data_as<char>();
          e.allgather(inputs[i].data_as<char>(), per, inputs[i].dtype(),
                      [&](int r) { return out + r * per; });
        }
      },
      outputs);
}

WorkPtr ShmBackend::gather(std::vector<std::vector<Tensor>>& outputs,
                           std::vector<Tensor>& inputs, const pg::GatherOptions& opts) {
  const int root = static_cast<int>(opts.root_rank);
  std::vector<Tensor> gathered = rank() == root ? outputs[0] : std::vector<Tensor>{};
  const Tensor input = inputs[0];
  return submit(
      OpType::kGather, "gather", opts.timeout, wants_async(opts),
      [gathered, input, root](Engine& e) {
        e.gather(input.data_as<char>(), input.nbytes(), input.dtype(), root,
                 [&](int r) { return gathered[r].data_as<char>(); });
      },
      gathered);
}

WorkPtr ShmBackend::scatter(std::vector<Tensor>& outputs,
                            std::vector<std::vector<Tensor>>& inputs,
                            const pg::ScatterOptions& opts) {
  const int root = static_cast<int>(opts.root_rank);
  std::vector<Tensor> sources = rank() == root ? inputs[0] : std::vector<Tensor>{};
  const Tensor output = outputs[0];
  return submit(
      OpType::kScatter, "scatter", opts.timeout, wants_async(opts),
      [sources, output, root](Engine& e) {
        e.scatter([&](int j) { return sources[j].data_as<const char>(); },
                  output.data_as<char>(), output.nbytes(), output.dtype(), root);
      },
      {output});
}

WorkPtr ShmBackend::reduce_scatter(std::vector<Tensor>& outputs,
                                   std::vector<std::vector<Tensor>>& inputs,
                                   const pg::ReduceScatterOptions& opts) {
  const ReduceOp op = opts.reduce_op;
  const Tensor output = outputs[0];
  const std::vector<Tensor> pieces = inputs[0];
  return submit(
      OpType::kReduceScatter, "reduce_scatter", opts.timeout, wants_async(opts),
      [output, pieces, op](Engine& e) {
        e.reduce_scatter([&](int j) { return pieces[j].data_as<const char>(); },
                         output.data_as<char>(), static_cast<size_t>(output.numel()),
                         output.dtype(), op);
      },
      {output});
}

namespace {

void reduce_scatter_flat(Engine& e, const Tensor& output, const Tensor& input, const ReduceOp& op) {
  e.reduce_scatter_flat(input.data_as<char>(), output.data_as<char>(),
                        static_cast<size_t>(output.numel()), output.dtype(), op);
}

}  // namespace

WorkPtr ShmBackend::reduce_scatter_base(Tensor& output, Tensor& input,
                                        const pg::ReduceScatterOptions& opts) {
  const ReduceOp op = opts.reduce_op;
  return submit(
      OpType::kReduceScatterBase, "reduce_scatter_base", opts.timeout, wants_async(opts),
      [output, input, op](Engine& e) { reduce_scatter_flat(e, output, input, op); }, {output});
}

WorkPtr ShmBackend::reduce_scatter_tensor_coalesced(std::vector<Tensor>& outputs,
                                                    std::vector<Tensor>& inputs,
                                                    const pg::ReduceScatterOptions& opts) {
  const ReduceOp op = opts.reduce_op;
  return submit(
      OpType::kReduceScatterBase, "reduce_scatter_tensor_coalesced", opts.timeout,
      wants_async(opts),
      [outputs, inputs, op](Engine& e) {
        for (size_t i = 0; i < inputs.size(); ++i) reduce_scatter_flat(e, outputs[i], inputs[i], op);
      },
      outputs);
}

WorkPtr ShmBackend::alltoall_base(Tensor& output, Tensor& input,
                                  std::vector<int64_t>& output_split_sizes,
                                  std::vector<int64_t>& input_split_sizes,
                                  const pg::AllToAllOptions& opts) {
  const std::vector<int64_t> out_splits = output_split_sizes;
  const std::vector<int64_t> in_splits = input_split_sizes;
  return submit(
      OpType::kAlltoallBase, "alltoall_base", opts.timeout, wants_async(opts),
      [output, input, out_splits, in_splits](Engine& e) {
        const int n = e.size();
        // Splits count rows of dimension 0; empty splits mean equal parts.
        auto layout = [n](const Tensor& t, const std::vector<int64_t>& splits,
                          std::vector<size_t>& offsets, std::vector<size_t>& lens) {
          const int64_t rows = t.dim() == 0 ? 1 : t.sizes()[0];
          const size_t row_bytes = rows == 0 ? 0 : t.nbytes() / static_cast<size_t>(rows);
          size_t at = 0;
          for (int r = 0; r < n; ++r) {
            const size_t len =
                static_cast<size_t>(splits.empty() ? rows / n : splits[r]) * row_bytes;
            offsets.push_back(at);
            lens.push_back(len);
            at += len;
          }
        };
        std::vector<size_t> in_off, in_len, out_off, out_len;
        layout(input, in_splits, in_off, in_len);
        layout(output, out_splits, out_off, out_len);
        std::vector<const char*> send(n);
        std::vector<char*> recv(n);
        for (int r = 0; r < n; ++r) {
          send[r] = input.data_as<char>() + in_off[r];
          recv[r] = output.data_as<char>() + out_off[r];
        }
        e.alltoall(send, in_len, recv, out_len);
      },
      {output});
}

WorkPtr ShmBackend::alltoall(std::vector<Tensor>& outputs, std::vector<Tensor>& inputs,
                             const pg::AllToAllOptions& opts) {
  return submit(
      OpType::kAlltoall, "alltoall", opts.timeout, wants_async(opts),
      [outputs, inputs](Engine& e) {
        const int n = e.size();
        std::vector<const char*> send(n);
        std::vector<char*> recv(n);
        std::vector<size_t> send_len(n), recv_len(n);
        for (int r = 0; r < n; ++r) {
          send[r] = inputs[r].data_as<char>();
          send_len[r] = inputs[r].nbytes();
          recv[r] = outputs[r].data_as<char>();
          recv_len[r] = outputs[r].nbytes();
        }
        e.alltoall(send, send_len, recv, recv_len);
      },
      outputs);
}

WorkPtr ShmBackend::barrier(const pg::BarrierOptions& opts) {
  return submit(OpType::kBarrier, "barrier", opts.timeout, wants_async(opts),
                [](Engine& e) { e.barrier(); }, {});
}

void ShmBackend::monitored_barrier(const pg::BarrierOptions& opts, bool wait_all_ranks) {
  pg::BarrierOptions sync_opts = opts;
  sync_opts.async_op = false;
  // Rank 0 waits for the others as long as the caller asked; they wait for rank 0 as long as
  // for any operation (pg::monitored_barrier_release_wait).
  const Millis monitored = opts.timeout > Millis::zero() ? opts.timeout : timeout();
  const Millis wait =
      rank() == 0 ? monitored : pg::monitored_barrier_release_wait(timeout(), monitored);
  WorkPtr work = submit(OpType::kBarrier, "monitored_barrier", wait, false,
                        [wait_all_ranks, monitored](Engine& e) {
                          e.monitored_barrier(wait_all_ranks, monitored);
                        },
                        {});
  work->wait();
}

// ---------------------------------------------------------------------------------------------
// Point to point

WorkPtr ShmBackend::send(std::vector<Tensor>& tensors, int dst_rank, int tag) {
  return post_p2p(OpType::kSend, tensors[0], dst_rank, tag);
}

WorkPtr ShmBackend::recv(std::vector<Tensor>& tensors, int src_rank, int tag) {
  return post_p2p(OpType::kRecv, tensors[0], src_rank, tag);
}

WorkPtr ShmBackend::recv_anysource(std::vector<Tensor>& tensors, int tag) {
  return post_p2p(OpType::kRecvAnySource, tensors[0], -1, tag);
}

WorkPtr ShmBackend::post_p2p(OpType type, Tensor tensor, int peer, int tag) {
  auto op = std::make_shared<P2POp>();
  op->is_send = type == OpType::kSend;
  op->peer = peer;
  op->tag = tag;
  op->data = tensor.data_as<char>();
  op->bytes = tensor.nbytes();
  op->tensor = tensor;
  op->timeout = timeout();
  op->deadline = core::Deadline(timeout());
  const char* what = op->is_send ? "send" : type == OpType::kRecv ? "recv" : "recv_anysource";
  op->description =
      peer >= 0 ? str_cat(what, " (tag ", tag, ", rank ", rank(), op->is_send ? " to" : " from",
                          " rank ", peer, ")")
                : str_cat(what, " (tag ", tag, ", rank ", rank(), " from any rank)");
  auto work = std::make_shared<P2PWork>(type, str_cat("shm:", what), p2p_, op);
  op->work = work;
  if (engine_->aborted.load()) {
    work->finish_with_error(std::make_exception_ptr(
        DistBackendError(str_cat("shm ", op->description, ": the backend was shut down"))));
    return work;
  }
  p2p_->post(op);
  return work;
}

}  // namespace c10d::backends::shm
