// SharedWriter: copies into memory that peers read after every write (the slots and the p2p
// channels), with plain or streaming stores as timing finds faster.
//
// Plain stores first take each line back from the reader's cache. That is cheap most of the
// time and, for seconds at a time (while the host runs the vCPUs on different core complexes),
// several times the copy itself; streaming stores cost about the same in either placement. The
// writer's own timing cannot choose (streaming copies always look faster to it, as the readers
// pay for them), so with C10D_SHM_STREAM=auto whole operations are timed: a ModeProbe per type
// of operation and size class (select) keeps whichever mode ran them faster, probing again
// every 50 ms; only the probes read the clock. The writers of one-sided operations (a
// broadcast's root, a gather's senders) return before their readers finish, so their probes
// lean to streaming. A writer without begin_op/select/end_op (the p2p channels) keeps plain
// stores. C10D_SHM_STREAM=0/1 fixes the choice. Measurements:
// docs/design/shm.md#streaming-stores-and-placement.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "c10d/backends/shm/mode_probe.h"
#include "c10d/core/copy.h"
#include "c10d/core/work.h"

namespace c10d::backends::shm::detail {

// The ways a pipelined allreduce can run (bits of a mode; SharedWriter::select).
inline constexpr int kModeStreaming = 1;  // streaming stores into the slots
inline constexpr int kModeLargeChunks =
    2;  // chunks of kSlotBytes instead of StepChannel::small_chunk

class SharedWriter {
 public:
  // `may_adapt`: whether auto may choose streaming stores (the collectives; the p2p channels
  // keep plain ones). Also when ranks outnumber cores, where each kind of store wins in one of
  // the placements too.
  // `leader`: rank 0, whose probes choose the mode of the pipelined allreduces (select);
  // `choose_chunks`: whether they also choose its chunk size (every rank has a core of its
  // own; see kPipelineChunk).
  explicit SharedWriter(bool may_adapt = false, bool leader = false, bool choose_chunks = false);

  void operator()(void* dst, const void* src, size_t n) { write(dst, src, n, streaming_); }
  // A copy that only ranks on this rank's CPU read: plain stores in either mode, counted like
  // the others (probes compare cost per byte written).
  void same_cpu(void* dst, const void* src, size_t n) { write(dst, src, n, false); }

  void begin_op(core::OpType type) {
    written_ = 0;
    type_ = probed_as(type);
    probe_ = nullptr;
  }

  // The operation moves `bytes` per rank: its type and size class choose the probe.
  //
  // A pipelined allreduce (an allreduce of more than kPipelineChunk bytes) runs in the mode
  // `agreed` (kModeStreaming, kModeLargeChunks) that rank 0 proposed in the previous one
  // (algo::pipelined). Rank 0 (the leader) times it and proposes what its probe wants next
  // (proposal), with large chunks only where the chunk is chosen (choose_chunks); the other
  // ranks do not probe it. Each rank choosing its own stores mixed the modes, and a rank's
  // probe then timed the others' choices as much as its own.
  void select(size_t bytes, int agreed);

  // Operations that move data alike share probes: reduce and the coalesced allreduce run
  // the pipelined allreduce. Each type probing alone started from whatever another type found
  // last (untried), and a benchmark's rows are too short for a probe: reduce then ran with
  // the stores broadcast's probe had found, at half all_reduce's speed.
  static core::OpType probed_as(core::OpType type) {
    return type == core::OpType::kReduce || type == core::OpType::kAllreduceCoalesced
               ? core::OpType::kAllreduce
               : type;
  }

  // Whether the writers of this type return before their readers finish: their probes time
  // only the writing, which favours streaming stores, so other types do not start from their
  // finds.
  static bool one_sided(core::OpType type) {
    return type == core::OpType::kBroadcast || type == core::OpType::kGather ||
           type == core::OpType::kScatter;
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

  // The host moved the vCPUs apart (`far`) or together (StepChannel::watch_placement): what the
  // probes found no longer holds, so every kind of operation takes the stores that suit the
  // new placement (streaming when far) until its next probe. Without this a benchmark's rows,
  // too short for a probe, kept plain stores through the slow placement.
  void placement_changed(bool far);

  // The operation begun last completed (not called when it failed).
  void end_op();

 private:
  void write(void* dst, const void* src, size_t n, bool stream) {
    written_ += n;
    if (stream) return core::stream_bytes(dst, src, n);
    core::copy_bytes(dst, src, n);
  }

  static constexpr size_t kProbedBytes = size_t{4} << 10;
  // A kind of operation is first probed once it took 200 ms in all, so that a benchmark's row
  // does not run inside a probe and time its slower modes.
  static ModeProbe::Config probe_config();
  // Size classes by powers of 4 from 4 KiB: [4, 16) KiB ... [1, 4) MiB, 4 MiB and up.
  static constexpr size_t kSizeClasses = 6;
  static constexpr size_t kTypes = static_cast<size_t>(core::OpType::kUnknown) + 1;
  const bool leader_;
  const bool choose_chunks_;
  bool adaptive_ = false;
  bool streaming_ = false;
  bool timed_ = false;
  int proposal_ = 0;
  int ran_ = 0;  // the mode the operation runs in
  core::OpType type_ = core::OpType::kUnknown;
  size_t written_ = 0;
  size_t bytes_ = 0;
  int64_t start_ = 0;
  ModeProbe* probe_ = nullptr;
  std::array<ModeProbe, kTypes * kSizeClasses> probes_;
  // The stores (1: streaming) the latest probe of each type found best, or -1; of any type.
  std::array<int, kTypes> found_;
  int found_any_ = -1;
};

}  // namespace c10d::backends::shm::detail
