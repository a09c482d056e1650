// Segment: the shared memory of one shm process group. Every rank owns one segment (an
// anonymous memfd, so nothing ever appears in /dev/shm) and maps every peer's segment, found
// through /proc/<pid>/fd/<fd> after a rendezvous in the store.
//
// Layout of one rank's segment (offsets from Layout):
//   header          step flag, p2p doorbell, closed flag (each on its own cache line)
//   channel ctrl    one ChannelCtrl per destination rank (sender side lives here)
//   slots[2]        per step parity: meta (kMetaBytes) | in (kSlotBytes) | out (kSlotBytes)
//   ring            kRingDepth small data areas (kRingBytes), one per step modulo the depth
//   channel data    kChannelBytes per destination rank
//   heap            memory handed out by ShmBackend::empty() (sparse: pages appear on use)
//
// Thread-safety: after construction a Segment is immutable except for the shared memory
// itself (whose protocol the backend defines) and the heap, which has its own mutex.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "c10d/core/deadline.h"
#include "c10d/pg/signature.h"
#include "c10d/store/store.h"

namespace c10d::backends::shm {

inline constexpr size_t kLine = 64;
// Data bytes of one step slot, per parity. Large collectives stream through it in chunks small
// enough to stay in cache between the copy-in and the reads of the peers.
inline constexpr size_t kSlotBytes = size_t{1} << 20;
// Per-step metadata (heap offsets, alltoall sizes): 8 bytes per rank.
inline constexpr size_t kMetaBytes = 8192;
inline constexpr int kMaxRanks = static_cast<int>(kMetaBytes / 8);
// Small steps use a ring of data areas instead of the parity slots, so that a rank may run up
// to kRingDepth - 1 steps ahead of its slowest peer (one-sided collectives: the root of a
// broadcast, the senders of a gather). When ranks outnumber cores this lets each rank do
// several operations per time slice instead of handing the core over for every one (4 ranks
// on 2 cores, scatter of 64 B: 1.4-2.0 us a call with 30 entries, 2.2-3.1 with 14).
inline constexpr uint32_t kRingDepth = 30;
// Signatures of the last kSignatureDepth steps ride on the step word's cache line.
inline constexpr uint32_t kSignatureDepth = 14;
inline constexpr size_t kRingBytes = size_t{16} << 10;
// Point-to-point bytes in flight per (sender, receiver) pair.
inline constexpr size_t kChannelBytes = size_t{64} << 10;
// From this size a message is read from the sender's buffer in one copy (ChannelCtrl), where
// it took a round trip through the channel per 64 KiB and two copies: send/recv round the
// ring at 2 ranks, 1 MiB 224 us and 16 MiB 13 ms against Open MPI's 104 us and 2.1 ms.
inline constexpr size_t kDirectMessageBytes = kChannelBytes;
// CPUs a segment header can describe (the affinity masks).
inline constexpr int kMaxCpus = 1024;

// A 32-bit futex word with a count of sleepers, so that the writer makes a system call only
// when someone sleeps.
struct alignas(kLine) FutexWord {
  std::atomic<uint32_t> value;
  std::atomic<uint32_t> waiters;
  // For the step word: the signature of the operation that published each of the last
  // kSignatureDepth steps (its OpType and a 24-bit hash of its sequence number and shape), so
  // a rank can tell when a peer runs a different collective or the same with another shape.
  // On the same cache line as the value, so checking it costs no extra miss.
  std::atomic<uint32_t> op[kSignatureDepth];
};
static_assert(sizeof(FutexWord) == kLine, "a step word and its signatures share one line");

// A small step's data (all_reduce, reduce, broadcast, gather and scatter of up to kBytes)
// together with the step number that publishes it, so a peer waiting on the mailbox finds
// the first bytes in the line it waited on and the rest in lines it loads at once (the
// adjacent line comes with the first), instead of first waiting on the step word and only
// then missing on the data. Written before the step word, indexed like the
// ring. One-shot allreduce, 2 ranks, time per call against the ring entries (3 launches
// each, median of 15 runs of 20000): 4 B 392-408 ns against 434-469, 64 B 412-428 against
// 445-451, 256 B 439-446 against 461-471. Up to 1 KiB (the benchmark's last latency size)
// and pairs of lines (a 128-byte block, which the L2 prefetcher fetches together).
struct alignas(2 * kLine) Mailbox {
  static constexpr size_t kLines = 18;
  std::atomic<uint32_t> step;
  std::atomic<uint32_t> op;  // the signature of the operation (as on the step word's line)
  static constexpr size_t kBytes = kLines * kLine - 2 * sizeof(uint32_t);
  unsigned char data[kBytes];
};
static_assert(sizeof(Mailbox) == Mailbox::kLines * kLine);

struct SegmentHeader {
  uint64_t magic;
  int32_t rank;
  int32_t size;
  int32_t pid;
  // Last collective step this rank published (see step_channel.h for the protocol).
  FutexWord step;
  // Bumped whenever point-to-point state addressed to this rank changes.
  FutexWord doorbell;
  // Set by shutdown(): peers waiting for this rank fail at once.
  alignas(kLine) std::atomic<uint32_t> closed;
  // Set when this rank gave up on an operation (StepChannel::fail), before its caller can reuse the
  // buffers peers may still be reading (StepChannel::sync_after_reads).
  std::atomic<uint32_t> abandoned;
  // The step this rank opened last (high 32 bits) and its operation's signature (low 32),
  // written as it opens it (StepChannel::show_step). Two ranks blocked in one step with different
  // operations wait for each other (StepChannel::check_waiting), e.g. gathers to different roots;
  // the end of a one-sided operation waits only for its peers to be here
  // (StepChannel::finish_step).
  std::atomic<uint64_t> blocked;
  // Set once this rank has mapped every peer's segment.
  std::atomic<uint32_t> mapped;
  // Where this segment is mapped in its owner's address space, and whether the owner could
  // read every peer's segment through process_vm_readv (1) or not (2); set before `mapped`.
  uint64_t self_address;
  uint32_t cma;
  // The CPUs this rank may run on (its affinity mask); set before `mapped`.
  uint64_t cpu_mask[kMaxCpus / 64];
  // The CPU this rank ran on when it last published a step, when it changed (StepChannel::publish):
  // a waiter on the same CPU yields at once instead of spinning.
  alignas(kLine) std::atomic<int32_t> cpu;
  // Rank 0's placement word (StepChannel::watch_placement): the step after which rank 0 times a
  // cache line's round trip with rank 1 (low 32 bits), whether the last one found the
  // vCPUs far apart (bit 32) and whether it timed any yet (bit 33). Only rank 0 writes it, a
  // few times a second.
  alignas(kLine) std::atomic<uint64_t> placement;
  // This rank's side of that round trip.
  alignas(kLine) std::atomic<uint64_t> ping;
  // What this rank ran at each of its last kRingDepth steps, in full (the step word carries
  // only a hash of the last kSignatureDepth), read when a peer's signature differs: a peer
  // that ran more than kSignatureDepth steps ahead overwrote it. Written as the step opens
  // (StepChannel::show_step), before it is published.
  alignas(kLine) pg::Signature described[kRingDepth];
  alignas(2 * kLine) Mailbox mailbox[kRingDepth];
};

// A message of up to kSmallMessageBytes, whole in one cache line: the receiver's one miss
// brings the header and the data together.
inline constexpr size_t kSmallMessageBytes = 48;
// Small messages a sender may have in flight to one receiver.
inline constexpr uint32_t kSmallMessages = 32;
struct alignas(kLine) SmallMessage {
  std::atomic<uint32_t> seq;  // the message's number on its channel + 1, stored last
  int32_t tag;
  uint32_t bytes;
  uint8_t dtype;  // core::DType
  char data[kSmallMessageBytes];
};
static_assert(sizeof(SmallMessage) == kLine);

// A buffer of rank r's as its peers read it: at `address` in r's address space, with bytes
// [lo, hi) of it also mapped in every rank from `part` on (r's heap: a heap tensor, or the
// pages of an ordinary buffer adopted into it, alias.h).
struct PeerBuffer {
  uint64_t address = 0;
  const char* part = nullptr;
  size_t lo = 0;
  size_t hi = 0;
};

// Control block of the channel from sender s to receiver d, in s's segment. The sender writes
// the fields and then bumps `posted`; the receiver copies the chunk and bumps `consumed`.
// Small messages go through `small`, a ring of kSmallMessages lines that the receiver takes
// in order (counting them in `small_consumed`), so a sender does not wait for each to be read.
// The two never carry messages at once (a small one waits for the chunks before it to be
// read, a chunked or offered one for the small ones before it), which keeps the order of
// the messages of a pair.
// A message of kDirectMessageBytes or more, where the peers can read each other's memory
// (Segment::cma), is offered whole instead: `address` is the sender's buffer, which the
// receiver reads once after taking the offer (in place where it is mapped, part_*, the rest
// through process_vm_readv); the send completes when `consumed` shows it read. `offer`
// settles a sender giving up against a receiver reading.
struct ChannelCtrl {
  enum Offer : uint32_t { kNone = 0, kOffered = 1, kTaken = 2, kWithdrawn = 3 };
  alignas(kLine) std::atomic<uint32_t> posted;
  int32_t tag;
  uint32_t bytes;    // of this chunk
  uint64_t total;    // of the message
  uint64_t offset;   // of this chunk in the message
  uint64_t address;  // of an offered message in the sender (0: the data is in the channel)
  uint8_t dtype;     // of the message (core::DType): a receive of another dtype fails
  // Bytes [part_lo, part_hi) of an offered message lie in the sender's heap from offset
  // part_heap on (-1: none), where the receiver reads them in place.
  int64_t part_heap;
  uint64_t part_lo;
  uint64_t part_hi;
  alignas(kLine) std::atomic<uint32_t> offer;
  alignas(kLine) std::atomic<uint32_t> consumed;
  alignas(kLine) std::atomic<uint32_t> small_consumed;
  SmallMessage small[kSmallMessages];
};

struct Layout {
  Layout(int size, size_t heap_bytes);
  size_t channels;      // offset of ChannelCtrl[size]
  size_t slots;         // offset of slot 0
  size_t slot_stride;   // meta + in + out
  size_t ring;          // offset of ring entry 0
  size_t channel_data;  // offset of channel data[size]
  size_t heap;          // offset of the heap
  size_t heap_bytes;
  size_t total;
};

// Heap blocks of at least this many bytes start on a page (mmap can map them elsewhere: see
// alias.h); smaller ones on a cache line.
inline constexpr size_t kPageAlignedBlockBytes = size_t{64} << 10;

// First-fit allocator over [0, bytes) of this rank's heap. Thread-safe.
class Heap {
 public:
  explicit Heap(size_t bytes);
  // Offset of a block of at least `bytes` (64-byte aligned, 4 KiB when large); throws
  // DistBackendError when the heap is full, naming its size and C10D_SHM_HEAP_BYTES.
  size_t allocate(size_t bytes);
  // The same, but nullopt when the heap is full.
  std::optional<size_t> try_allocate(size_t bytes);
  void release(size_t offset, size_t bytes);

 private:
  std::mutex mutex_;
  std::map<size_t, size_t> free_;  // offset -> bytes; guarded by mutex_
  size_t bytes_;
};

class Segment {
 public:
  // Creates this rank's segment, publishes it in `store`, maps every peer's, checks that all
  // ranks share one host (hostname + boot id, or C10D_SHM_HOST_ID) and waits until every rank
  // has mapped everything. Throws DistBackendError naming the problem.
  Segment(store::Store& store, int rank, int size, size_t heap_bytes, core::Millis timeout);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const Layout& layout() const { return layout_; }

  char* base(int r) const { return bases_[r]; }
  SegmentHeader* header(int r) const { return reinterpret_cast<SegmentHeader*>(bases_[r]); }
  char* meta(int r, uint32_t parity) const {
    return bases_[r] + layout_.slots + (parity & 1) * layout_.slot_stride;
  }
  char* in(int r, uint32_t parity) const { return meta(r, parity) + kMetaBytes; }
  char* out(int r, uint32_t parity) const { return in(r, parity) + kSlotBytes; }
  // Rank r's ring entry for step s.
  char* ring(int r, uint32_t s) const {
    return bases_[r] + layout_.ring + (s % kRingDepth) * kRingBytes;
  }
  ChannelCtrl* channel(int from, int to) const {
    return reinterpret_cast<ChannelCtrl*>(bases_[from] + layout_.channels) + to;
  }
  char* channel_data(int from, int to) const {
    return bases_[from] + layout_.channel_data + static_cast<size_t>(to) * kChannelBytes;
  }
  char* heap(int r) const { return bases_[r] + layout_.heap; }
  Heap& own_heap() { return heap_; }
  // This rank's segment file (a memfd; the heap starts at layout().heap in it).
  int own_fd() const { return fd_; }
  // Offset of [ptr, ptr + bytes) inside this rank's heap, or -1 when it is elsewhere.
  int64_t heap_offset(const void* ptr, size_t bytes) const;

  // Empty while rank r runs; otherwise why it is gone ("exited", "shut down its backend").
  std::string peer_gone(int r) const;
  int pid(int r) const { return pids_[r]; }

  // Whether every rank may copy straight from and to every other rank's private memory
  // (cross-memory attach; C10D_SHM_CMA=1 and the kernel allows it). The same on all ranks.
  bool cma() const { return cma_; }
  // How many CPUs the ranks may run on together (the union of their affinity masks, e.g.
  // fewer than the machine's under taskset or a container's cpuset). The same on all ranks.
  int cpus() const { return cpus_; }
  // Pins the calling thread (and the threads it starts later) to one CPU of the ranks' masks
  // when C10D_SHM_BIND asks for it (see env.h); returns that CPU, or -1 when it does not pin.
  int bind_cpu() const;
  // Copies `bytes` from `remote`, an address in rank r's address space, to this process's
  // `local`. Throws DistBackendError naming the rank when the kernel refuses. There is no
  // write counterpart: a rank never writes into a peer's memory (a peer that gave up on an
  // operation may have reused it).
  void read_peer(int r, void* local, uint64_t remote, size_t bytes) const;
  // Copies bytes [off, off + n) of rank r's buffer `b` into `dst`: the mapped ones in place,
  // the rest through the kernel (read_peer). Throws DistBackendError as read_peer does, and
  // when `b` claims bytes outside r's heap.
  void read_peer_buffer(int r, const PeerBuffer& b, char* dst, size_t off, size_t n) const;

 private:
  // Faults in rank r's headers, step metadata, ring and channels before the first operation.
  // The slots' 4 MiB and the heap fault in as they are used: faulting the slots too took 2-3
  // ms of every group's creation, and a group's first pipelined collective pays ~0.7 ms at
  // 1 MiB instead.
  void touch_control(int r, bool write) const;

  // Whether process_vm_readv can read every peer's header (and C10D_SHM_CMA allows it).
  bool probe_cma() const;

  int rank_;
  int size_;
  int fd_ = -1;
  Layout layout_;
  std::vector<char*> bases_;
  std::vector<int> pids_;
  std::vector<int> pidfds_;  // -1 for this process (and when pidfd_open is unavailable)
  bool cma_ = false;
  int cpus_ = 1;
  Heap heap_;
};

}  // namespace c10d::backends::shm
