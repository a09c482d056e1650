// StepChannel: the step protocol between the ranks of an shm group, which the collective
// algorithms (collectives.h) run over. One operation at a time runs on a channel: the one the
// backend's pg::OpQueue lets run (pg/op_queue.h); abort() may be called from any thread.
//
// Step protocol. Every rank maps every peer's segment (segment.h), and a collective advances
// in steps, numbered alike on every rank. A rank writes its data for step s into its own
// segment: its slots of parity s % 2, or for small steps its ring entry or Mailbox of
// s % kRingDepth (a mailbox also carries the step, so a reader waiting on it finds the data
// with the step). It then publishes s in its step word, and a peer may read that data once it
// saw s there (or in the mailbox). A rank publishes s only after it finished reading
// everything of step s - 1, so no step needs a second barrier: a two-sided step (sync) waits
// for every peer, a one-sided one (finish_step) only for the peers whose data it reads, so a
// root can run ahead. Every rank announces each step it opens (show_step), and the last step
// of a one-sided operation waits until every peer opened it too (finish_step), not until
// it finished: every rank checks every peer's signature once per operation, so a mismatch
// fails on all of them, while a root still writes operation k + 1 as its peers read
// operation k. Before it writes, a rank waits until no peer can still read what it
// overwrites (next_step): until every peer published s - 1 for the parity slots (s - 2 for a
// one-sided step when the step two back was one-sided too), s - (kRingDepth - 1) for a ring
// entry or mailbox.
//
// With each step a rank publishes its operation's signature (OpType and a hash of sequence
// number and shape) on the step word's line, and the full description in its header, so a
// peer that ran another collective at that step, or the same one with another shape, is named
// at once (check_same_op). Waits spin, yield and then sleep on the step word's futex
// (WaitPolicy), checking every kCheckNs whether the awaited peers are alive, the deadline
// passed, shutdown() was called, or a peer waits in the same step in another operation
// (check_waiting). A failed wait or check (fail) leaves the channel broken: the step words no
// longer agree, so every later operation fails at once with the original error.
//
// step_channel.cc holds the protocol, the waits and checks, placement watching and the
// calibration's agreement; direct.cc the reads of the peers' own buffers (in place or through
// the kernel) that the direct paths of the algorithms take instead of the slots.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "c10d/backends/shm/futex.h"
#include "c10d/backends/shm/mode_probe.h"
#include "c10d/backends/shm/segment.h"
#include "c10d/backends/shm/shared_writer.h"
#include "c10d/backends/shm/tuning.h"
#include "c10d/core/copy.h"
#include "c10d/core/deadline.h"
#include "c10d/core/dtype.h"
#include "c10d/core/exception.h"
#include "c10d/core/reduce_op.h"
#include "c10d/core/work.h"

namespace c10d::backends::shm {

// Helpers the channel and the algorithms share.
namespace detail {

inline size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

inline void copy(void* dst, const void* src, size_t n) { core::copy_bytes(dst, src, n); }

// Elements per piece when `count` elements are split across `size` owners, rounded up to a
// whole cache line of elements so owners never share a line.
inline size_t piece_elems(size_t count, int size, size_t element) {
  const size_t align = std::max<size_t>(1, kLine / element);
  return (ceil_div(count, static_cast<size_t>(size)) + align - 1) / align * align;
}

// Piece j of `count` elements: [begin, begin + len).
inline void piece_of(size_t count, int size, size_t element, int j, size_t& begin, size_t& len) {
  const size_t per = piece_elems(count, size, element);
  begin = std::min(count, per * static_cast<size_t>(j));
  len = std::min(count, begin + per) - begin;
}

}  // namespace detail

class StepChannel {
 public:
  StepChannel(std::shared_ptr<Segment> segment, bool pinned);

  // Shutdown: the running operation and every later one fail ("the backend was shut down").
  // From any thread.
  void abort() { aborted_.store(true); }
  bool aborted() const { return aborted_.load(); }

  const std::shared_ptr<Segment>& segment() const { return segment_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  const detail::WaitPolicy& policy() const { return policy_; }

  // The operation about to run; throws when the channel cannot run it.
  void begin(const char* name, core::OpType type, uint64_t seq, core::Millis timeout);

  // The operation begun last completed.
  void end() { copy_shared_.end_op(); }

  // What rank 0's latest timing of round trips found (whether ranks 0 and 1 run far apart),
  // once it timed any (watch_placement); read from its placement word, so from any thread.
  std::optional<bool> far_apart() const {
    const uint64_t word = seg_.header(0)->placement.load(std::memory_order_acquire);
    if ((word & kTimedBit) == 0) return std::nullopt;
    return (word & kFarBit) != 0;
  }

  std::string describe() const;

  // Times `allreduce(large_chunks)` (pipelined allreduces of kCalibrationBytes) in both
  // chunk sizes, interleaved, and starts with the faster one on rank 0: which wins depends on
  // the machine (kPipelineChunk). With stores that adapt, plain and streaming ones too (see
  // SharedWriter). Ranks that share cores keep their chunk size and only time the stores, if
  // they adapt.
  void calibrate(core::Millis timeout, const std::function<void(bool large_chunks)>& allreduce);

  // --- what the algorithms read of the channel ---

  Segment& seg() const { return seg_; }
  // Whether ranks share CPUs and were pinned to them (see shares_cpu).
  bool pinned_to_shared_cpus() const { return cpu_group_ >= 0; }
  size_t small_chunk() const { return small_chunk_; }
  size_t direct_piece() const { return direct_piece_; }
  core::Millis timeout() const { return timeout_; }
  bool deadline_expired() const { return deadline_.expired(); }
  // The copies into shared lines (plain or streaming stores, see SharedWriter).
  detail::SharedWriter& writer() { return copy_shared_; }
  // The pipelined allreduce's mode (kModeStreaming, kModeLargeChunks), which its ranks agree
  // on for the next one in each one's first step.
  int agreed_mode() const { return agreed_mode_; }
  void set_agreed_mode(int mode) { agreed_mode_ = mode; }
  // Buffers the algorithms keep between operations, so that collectives do not allocate.
  struct Scratch {
    std::vector<char> bytes;              // pieces read through the kernel, or only for the peers
    std::vector<const void*> sources;     // a reduction's operands
    std::vector<size_t> incoming;         // alltoall: bytes each peer sends this rank
    std::vector<const char*> equal_send;  // alltoall_equal's parts
    std::vector<char*> equal_recv;
    std::vector<size_t> equal_lens;
  };
  Scratch& scratch() { return scratch_; }

  // --- the step protocol (step_channel.cc) ---

  void barrier() { sync(next_step()); }

  // The last step of an operation whose ranks read each other's buffers (in place or through
  // the kernel): fails if a peer gave up on the operation meanwhile, since it may have reused
  // the buffer this rank was reading.
  void sync_after_reads();

  void publish(uint32_t s);

  // Whether rank r was pinned to this rank's CPU (cpu_group_). While the host keeps the vCPUs
  // far apart the slots take streaming stores, which send every line to memory; a line only a
  // rank on this CPU reads is better left in the caches they share (see
  // docs/design/shm.md#streaming-stores-and-placement).
  bool shares_cpu(int r) const { return cpu_group_ >= 0 && r % seg_.cpus() == cpu_group_; }

  uint32_t next_step(bool small = false, bool one_sided = false);

  // Whether a step moving `bytes` per rank fits a ring entry, and rank r's entry (or its
  // parity slot) for step s.
  static bool fits_ring(size_t bytes) { return bytes <= kRingBytes; }
  char* slot(int r, uint32_t s, bool small) const {
    return small ? seg_.ring(r, s) : seg_.in(r, s);
  }

  void sync(uint32_t s);

  // Ends a one-sided step. The `last` of its operation also waits until every peer reached
  // it (await_arrival), so a mismatch raises on every rank (a broadcast's root, a gather's
  // senders), not only on the ranks that read the mismatched data.
  void finish_step(uint32_t s, bool last);

  std::vector<int> not_arrived(uint32_t s) const;
  void wait_peer(int r, uint32_t s);

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
  void claim_next_mailbox();
  // Rank r's data of small step s (ring entry or parity slot, or mailbox when `boxed`), and
  // the wait for it.
  char* step_data(int r, uint32_t s, bool small, bool boxed) const {
    return boxed ? mailbox_data(r, s) : slot(r, s, small);
  }
  void wait_step_data(int r, uint32_t s, bool boxed) {
    if (boxed) return await_mailbox(r, s);
    wait_peer(r, s);
  }
  void await_mailbox(int r, uint32_t s);

  // Step s is done here: this rank published it and read what it needed of it (all_peers:
  // every peer published it too), for algorithms that wait for their peers themselves.
  void complete(uint32_t s, bool all_peers) {
    step_ = s;
    if (all_peers) all_reached_ = s;
  }

  // Rank 0's word in the meta area of step s: what rank 0 writes there before it publishes s,
  // every rank reads once it waited for s (pipelined's chunk agreement, calibrate's decision).
  uint64_t& rank0_word(uint32_t s) const { return *reinterpret_cast<uint64_t*>(seg_.meta(0, s)); }

  // --- reads of the peers' own buffers (direct.cc) ---

  // Whether a message of `bytes` goes straight between the ranks' memory (the same answer on
  // every rank).
  bool direct(size_t bytes) const { return seg_.cma() && bytes >= detail::kDirectBytes; }
  // The same for broadcast, gather and all_gather, whose slot path (one-sided for broadcast
  // and gather) beats the direct one, whose final wait needs every rank to run, up to several
  // MiB (see docs/design/shm.md#direct-or-slots).
  bool direct_fanout(size_t bytes) const {
    return seg_.cma() && bytes >= detail::kDirectFanoutBytes;
  }
  // Whether a mid-sized message of broadcast, all_gather or alltoall goes direct (see
  // kDirectMidBytes); the same answer on every rank.
  bool direct_mid(size_t bytes, size_t end = detail::kDirectMidEndBytes) const {
    return own_core_ && seg_.cma() && bytes >= detail::kDirectMidBytes && bytes < end;
  }

  // Where rank r's buffer of an operation is: at an address in r's own address space, with
  // bytes [lo, hi) of it perhaps also mapped here (PeerBuffer); all of them when `mapped` (it
  // lies in r's shared heap, or an alias covers it whole).
  struct Where : PeerBuffer {
    const char* mapped = nullptr;
  };

  static bool all_mapped(const std::vector<Where>& where) {
    return std::all_of(where.begin(), where.end(),
                       [](const Where& w) { return w.mapped != nullptr; });
  }

  // Whether at least half of a buffer of `bytes` is mapped here (the heap or an alias), so
  // that a reader finds most of it in place.
  static bool mostly_mapped(const Where& w, size_t bytes) {
    return w.part != nullptr && 2 * (w.hi - w.lo) >= bytes;
  }
  static bool mostly_mapped(const std::vector<Where>& where, size_t bytes) {
    return std::all_of(where.begin(), where.end(),
                       [&](const Where& w) { return mostly_mapped(w, bytes); });
  }

  // `path`: rank 0's choice for an allreduce that could take either path (path_probe); every
  // rank finds it in located_path() afterwards.
  const std::vector<Where>& locate(const void* data, size_t bytes, int path = 0);
  // Rank 0's timings of allreduces on mapped tensors, per power of two of their size: mode
  // kPathInPlace (owner computes) or kPathSlots (pipelined). Which wins in between 256 KiB
  // and a few MiB changes with the placement and the load.
  static constexpr int kPathInPlace = 0;
  static constexpr int kPathSlots = 1;
  int located_path() const { return located_path_; }
  size_t direct_allreduce_bytes() const;
  ModeProbe& path_probe(size_t bytes);
  void read_from(int r, void* local, uint64_t remote, size_t bytes);
  // Copies bytes [off, off + n) of rank r's buffer `w` into `dst`: what is mapped here in
  // place, the rest through the kernel.
  void read_range(const Where& w, int r, char* dst, size_t off, size_t n);

  // --- signatures and failures (step_channel.cc) ---

  void expect(size_t count, std::optional<core::DType> dtype = std::nullopt, int root = -1,
              std::optional<core::ReduceOp::Kind> reduce = std::nullopt);
  void expect_moved(size_t bytes, core::DType dtype, int root = -1);
  // Whether the expected operation moves nothing (`n` bytes or elements is 0); if so, its
  // ranks still compare their calls in one step, so that a rank whose call differs fails
  // everywhere instead of everyone returning.
  bool nothing_to_move(size_t n) {
    if (n != 0) return false;
    if (size_ > 1) barrier();
    return true;
  }
  // Fails the operation and leaves the channel broken (every later operation fails too).
  template <typename Error>
  [[noreturn]] void fail(std::string message) {
    broken_ = message;
    seg_.header(rank_)->abandoned.store(1, std::memory_order_seq_cst);
    throw Error(message);
  }

 private:
  // calibrate's verdict, timed now or remembered from an earlier group of the same processes
  // (rank 0 sets kRememberedBit in its word when it remembers one).
  void adopt_mode(int mode);
  static constexpr uint64_t kRememberedBit = uint64_t{1} << 63;
  static std::optional<int> remembered_mode(const std::vector<int>& members,
                                            const std::vector<int>& modes);
  static void remember_mode(const std::vector<int>& members, const std::vector<int>& modes,
                            int mode);

  [[noreturn]] void peer_copy_failed(int r, const core::DistBackendError& e);

  void note_cpu(SegmentHeader* h);
  bool peer_on_my_cpu(int r) const;
  void await_arrival(int r, uint32_t s);
  uint32_t await_step(int r, uint32_t s);

  // --- signatures and failure diagnosis ---

  static uint32_t signature(const pg::Signature& d);
  static std::string shape_text(const pg::Signature& d);
  static std::string description_text(const pg::Signature& d);
  // Peer r published step s for this operation with the same shape. Otherwise the ranks
  // issued different collectives, or in a different order, or with different sizes, dtypes,
  // roots or reductions: fail naming both sides. Valid while this rank has not published
  // s + 1: r cannot reuse the entry (s + kRingDepth) before that. The signature on the step
  // word's line decides at once unless r ran kSignatureDepth steps further and replaced it.
  void check_same_op(int r, uint32_t s);
  std::string peer_call(int r, uint32_t s, uint32_t sig) const;
  [[noreturn]] void fail_mismatch(int r, const std::string& theirs, const char* verb);
  void check_not_waiting_for_each_other(const std::vector<int>& missing);
  void check_waiting(uint32_t s);

  void show_step();

  // --- placement watching ---

  bool placement_due();
  void watch_placement(uint32_t s, bool time_trips);
  int64_t round_trip(uint32_t s, int peer, bool leading);
  void set_placement(bool far);

  std::shared_ptr<Segment> segment_;
  Segment& seg_;
  const int rank_;
  const int size_;
  const size_t per_core_;  // ranks per core (ranks_per_core)
  const detail::WaitPolicy policy_;
  const bool own_core_;            // every rank has a core of its own
  const size_t direct_piece_;      // owner_computes' piece through the kernel
  const size_t direct_allreduce_;  // allreduce of ordinary tensors goes direct from this size
  const size_t small_chunk_;       // the pipelined allreduce's chunk unless kModeLargeChunks
  const int64_t far_trip_ns_;      // watch_placement's verdict: far apart from this round trip
  detail::SharedWriter copy_shared_;
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
  int located_path_ = 0;      // rank 0's path as the last locate() handed it out
  std::array<ModeProbe, 16> path_probes_;
  int64_t next_placement_ns_ = 0;
  uint32_t syncs_ = 0;
  Scratch scratch_;
  std::vector<Where> where_;  // locate()
  std::atomic<bool> aborted_{false};
  std::string broken_;  // why the step flags can no longer be trusted (set while running)
  const char* name_ = "";
  uint64_t seq_ = 0;
  pg::Signature described_;  // the running operation (begin, expect)
  uint32_t op_ = 0;          // signature(described_)
  core::Millis timeout_{0};
  core::Deadline deadline_{core::Millis(0)};  // set by the operation's first long wait
  bool deadline_started_ = false;
};

}  // namespace c10d::backends::shm
