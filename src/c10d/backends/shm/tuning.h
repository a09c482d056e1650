// The shm backend's tuning: the sizes and times at which its algorithms switch. One line of
// reasoning each here; the measurements behind them are in docs/design/shm.md.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "c10d/backends/shm/segment.h"

namespace c10d::backends::shm::detail {

// --- Chunk sizes (see docs/design/shm.md#chunk-size) ---

// Up to this many bytes an allreduce copies in once and every rank reduces every slot.
inline constexpr size_t kOneShotBytes = size_t{32} << 10;
// The pipelined allreduce's chunk (or kSlotBytes, whichever StepChannel::calibrate and the probes
// find faster): smaller chunks keep one step's copies in L2, overlapping the peers'.
inline constexpr size_t kPipelineChunk = size_t{256} << 10;
static_assert(kPipelineChunk <= kSlotBytes);
// The pipelined allreduce copies a reduced piece to the peers in blocks this large, so that the
// copy reads each block from L1 instead of the whole piece back from L2 or L3.
inline constexpr size_t kPublishBlock = size_t{16} << 10;
// Owner-computes on shared-heap tensors works in pieces this large, so the reduced piece is
// still in cache when it is copied to the peers.
inline constexpr size_t kZeroCopyPiece = size_t{64} << 10;
// A direct allreduce moves pieces this large per system call: the calls and page pinning are
// cheap per byte, and the landing area and the piece being reduced stay in L2.
inline constexpr size_t kDirectPiece = size_t{512} << 10;

// The pipelined allreduce's chunk when ranks share cores: the ranks of one core together move
// about one slot per step (fewer steps, fewer context switches), never less than
// kPipelineChunk each.
inline size_t shared_core_chunk(size_t per_core) {
  return std::max(kPipelineChunk, kSlotBytes / per_core / kLine * kLine);
}

// owner_computes' piece for tensors read through the kernel: kDirectPiece, shared by the ranks
// that share a core (the piece and its landing area should stay in that core's L2).
inline size_t direct_piece(size_t per_core) {
  return std::max<size_t>(kLine, kDirectPiece / per_core / kLine * kLine);
}

// --- Direct paths or slots (see docs/design/shm.md#direct-or-slots) ---
// The direct paths copy straight between the ranks' own memory through the kernel
// (Segment::cma): one copy per byte instead of two, but every call pins the pages.

// Scatter (a part) and alltoall (the largest part) go direct from this size: below it, the
// slots win.
inline constexpr size_t kDirectBytes = size_t{4} << 20;
// Allreduce of ordinary tensors streams through the slots in cache-sized chunks up to this
// size; past it the direct path's smaller memory traffic wins.
inline constexpr size_t kDirectAllreduceBytes = size_t{64} << 20;
// The same while the host keeps the vCPUs far apart (StepChannel::watch_placement): every slot line
// then crosses between core complexes, and the path that moves each byte once wins sooner.
inline constexpr size_t kDirectAllreduceFarBytes = size_t{16} << 20;
// The same when ranks share cores and are pinned (Segment::bind_cpu): the slots still win at
// 64 MiB, the direct path at 128 MiB.
inline constexpr size_t kDirectAllreduceSharedCoreBytes = size_t{96} << 20;
// Allreduces of mapped tensors smaller than this are timed both ways (owner computes, slots;
// StepChannel::path_probe): which wins changes with the placement and the load. From here owner
// computes always wins by far, and probing the slots would cost more than it could find.
inline constexpr size_t kPathProbeBytes = size_t{4} << 20;
// Broadcast, gather and all_gather go direct from this size (StepChannel::direct_fanout): their
// slot path (one-sided for broadcast and gather) wins up to several MiB.
inline constexpr size_t kDirectFanoutBytes = size_t{8} << 20;
// With a core per rank, broadcast, all_gather and alltoall also go direct for mid-sized parts
// from here: two copies through the slots cost more than one through the kernel ...
inline constexpr size_t kDirectMidBytes = size_t{64} << 10;
// ... below this size; from it the slots win again.
inline constexpr size_t kDirectMidEndBytes = size_t{512} << 10;
// Broadcast stays direct on up to kDirectFanoutBytes: its receivers take longer through the
// slots than one kernel copy, although the root runs ahead.
inline constexpr size_t kBroadcastMidEndBytes = kDirectFanoutBytes;

// --- Calibration (see docs/design/shm.md#calibration) ---
// StepChannel::calibrate times pipelined allreduces in every configuration (chunk size, plain or
// streaming stores) at init, since the probes find a slow configuration only after a while.

// Rounds per configuration, interleaved.
inline constexpr int kCalibrationRounds = 4;
// Allreduces per round; the first of each is not timed (it pays for the switch).
inline constexpr int kCalibrationRuns = 3;
// The size of each calibration allreduce.
inline constexpr size_t kCalibrationBytes = size_t{2} << 20;

// --- Placement (see docs/design/shm.md#streaming-stores-and-placement) ---
// StepChannel::watch_placement: rank 0 times a cache line's round trip with rank 1; from a median
// trip of C10D_SHM_FAR_TRIP_NS the vCPUs count as far apart.

// How often rank 0 times the round trips.
inline constexpr int64_t kPlacementPeriodNs = 100'000'000;
// Trips per timing (their median counts).
inline constexpr int kPlacementTrips = 16;
// How long either side waits for the other before it gives up on a timing.
inline constexpr int64_t kPlacementGiveUpNs = 50'000;

// --- Waits (see docs/design/shm.md#wait-policy) ---

// How often a blocked wait checks the peers, the deadline and shutdown.
inline constexpr int64_t kCheckNs = 1'000'000;
// The longest futex sleep of a blocked wait, after which it looks again.
inline constexpr int64_t kSleepNs = 2'000'000;
// Spins a wait makes before it first reads the clock (StepChannel::await_step), when every rank has
// a core of its own.
inline constexpr int kBlindSpins = 32;
// A wait for a peer's Mailbox spins this many times kBlindSpins on the mailbox's line before
// it waits on the step word (StepChannel::await_mailbox): a couple of microseconds, which covers
// the skew between ranks of most small operations.
inline constexpr int kMailboxSpins = 4;

}  // namespace c10d::backends::shm::detail
