#include "c10d/backends/shm/segment.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>

#include "c10d/core/copy.h"
#include "c10d/core/env.h"
#include "c10d/core/exception.h"
#include "c10d/net/host.h"

namespace c10d::backends::shm {

using core::DistBackendError;
using core::detail::str_cat;

namespace {

constexpr uint64_t kMagic = 0x6331306473686d31ULL;  // "c10dshm1", checked after mapping

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

std::string errno_text(int err) { return std::strerror(err); }

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

int open_pidfd(int pid) {
#ifdef SYS_pidfd_open
  long fd = ::syscall(SYS_pidfd_open, pid, 0);
  return fd < 0 ? -1 : static_cast<int>(fd);
#else
  return -1;
#endif
}

// "pid fd bytes host" in the store; the host identity may contain spaces, so it comes last.
struct PeerInfo {
  int pid = 0;
  int fd = -1;
  size_t bytes = 0;
  std::string host;
};

std::string encode(const PeerInfo& p) {
  return str_cat(p.pid, " ", p.fd, " ", p.bytes, " ", p.host);
}

PeerInfo decode(const std::string& text) {
  PeerInfo p;
  std::istringstream in(text);
  in >> p.pid >> p.fd >> p.bytes;
  in.get();
  std::getline(in, p.host);
  return p;
}

// Faults in the pages of [base, base + bytes) (see Segment::touch_control for which). A first
// touch of a shared page costs a microsecond or more in these VMs; for the pages every
// operation uses it is paid here, at init. The owner writes (zeros, which is what a new segment
// holds) before it publishes the segment; peers read.
void touch_pages(char* base, size_t bytes, bool write) {
  // One call faults the range in where the kernel can (Linux 5.14+).
  if (::madvise(base, bytes, write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ) == 0) return;
  for (size_t off = 0; off < bytes; off += 4096) {
    if (write) {
      reinterpret_cast<volatile char*>(base)[off] = 0;
    } else {
      (void)reinterpret_cast<volatile const char*>(base)[off];
    }
  }
}

// This thread's affinity mask as kMaxCpus bits; every online CPU when it cannot be read.
void write_cpu_mask(uint64_t (&mask)[kMaxCpus / 64]) {
  std::fill(std::begin(mask), std::end(mask), 0);
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) {
    const long online = std::clamp(::sysconf(_SC_NPROCESSORS_ONLN), 1L, long{kMaxCpus});
    for (long c = 0; c < online; ++c) CPU_SET(c, &set);
  }
  for (int c = 0; c < std::min(kMaxCpus, CPU_SETSIZE); ++c) {
    if (CPU_ISSET(c, &set)) mask[c / 64] |= uint64_t{1} << (c % 64);
  }
}

}  // namespace

Layout::Layout(int size, size_t heap_bytes_in) {
  const size_t n = static_cast<size_t>(size);
  channels = round_up(sizeof(SegmentHeader), 4096);
  slots = channels + round_up(n * sizeof(ChannelCtrl), 4096);
  slot_stride = kMetaBytes + 2 * kSlotBytes;
  ring = slots + 2 * slot_stride;
  channel_data = ring + kRingDepth * kRingBytes;
  heap = round_up(channel_data + n * kChannelBytes, size_t{2} << 20);
  heap_bytes = round_up(heap_bytes_in, 4096);
  total = heap + heap_bytes;
}

// ---------------------------------------------------------------------------------------------
// Heap

Heap::Heap(size_t bytes) : bytes_(bytes) {
  if (bytes > 0) free_[0] = bytes;
}

size_t Heap::allocate(size_t bytes) {
  if (const std::optional<size_t> offset = try_allocate(bytes)) return *offset;
  throw DistBackendError(str_cat("shm_empty: cannot allocate ", bytes,
                                 " bytes: the shared heap of ", bytes_,
                                 " bytes is full (raise C10D_SHM_HEAP_BYTES)"));
}

std::optional<size_t> Heap::try_allocate(size_t bytes) {
  const size_t align = bytes >= kPageAlignedBlockBytes ? 4096 : 64;
  const size_t want = round_up(std::max<size_t>(bytes, 1), 64);
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    const size_t start = round_up(it->first, align);
    const size_t end = it->first + it->second;
    if (start + want > end) continue;
    const size_t block_start = it->first;
    free_.erase(it);
    if (start > block_start) free_[block_start] = start - block_start;
    if (start + want < end) free_[start + want] = end - (start + want);
    return start;
  }
  return std::nullopt;
}

void Heap::release(size_t offset, size_t bytes) {
  const size_t size = round_up(std::max<size_t>(bytes, 1), 64);
  std::lock_guard<std::mutex> lock(mutex_);
  auto [it, inserted] = free_.emplace(offset, size);
  if (!inserted) return;  // double free: ignore rather than corrupt the map
  auto next = std::next(it);
  if (next != free_.end() && it->first + it->second == next->first) {
    it->second += next->second;
    free_.erase(next);
  }
  if (it != free_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      free_.erase(it);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Segment

Segment::Segment(store::Store& store, int rank, int size, size_t heap_bytes, core::Millis timeout)
    : rank_(rank), size_(size), layout_(size, heap_bytes), bases_(size, nullptr), pids_(size, 0),
      pidfds_(size, -1), heap_(layout_.heap_bytes) {
  C10D_CHECK_T(DistBackendError, size <= kMaxRanks, "shm backend supports at most ", kMaxRanks,
               " ranks, got ", size);
  const std::string who = str_cat("shm backend rank ", rank, " of ", size);
  // An anonymous memfd: it has no name in /dev/shm, so a crash can leak nothing.
  int fd = ::memfd_create(str_cat("c10d-shm-r", rank).c_str(), MFD_CLOEXEC);
  if (fd < 0) throw DistBackendError(str_cat(who, ": memfd_create failed: ", errno_text(errno)));
  auto fail = [&](const std::string& what) {
    const int err = errno;
    ::close(fd);
    for (char*& b : bases_) {
      if (b != nullptr) ::munmap(b, layout_.total);
      b = nullptr;
    }
    throw DistBackendError(str_cat(who, ": ", what, err ? ": " + errno_text(err) : ""));
  };
  if (::ftruncate(fd, static_cast<off_t>(layout_.total)) != 0) {
    fail(str_cat("cannot size the segment to ", layout_.total, " bytes"));
  }
  void* mine =
      ::mmap(nullptr, layout_.total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  if (mine == MAP_FAILED) fail("cannot map the segment");
  bases_[rank] = static_cast<char*>(mine);
  touch_control(rank, /*write=*/true);
  auto* h = header(rank);
  h->magic = kMagic;
  h->rank = rank;
  h->size = size;
  h->pid = static_cast<int32_t>(::getpid());
  h->self_address = reinterpret_cast<uint64_t>(mine);
  pids_[rank] = h->pid;

  PeerInfo me{h->pid, fd, layout_.total, net::host_identity()};
  try {
    store.set(str_cat("shm/info/", rank), store::to_bytes(encode(me)));
    std::vector<PeerInfo> peers(size);
    for (int r = 0; r < size; ++r) {
      peers[r] = r == rank ? me : decode(store::to_string(store.get(str_cat("shm/info/", r))));
    }
    for (int r = 0; r < size; ++r) {
      if (peers[r].host != me.host) {
        errno = 0;
        fail(str_cat("rank ", r, " runs on host '", peers[r].host, "' but rank ", rank,
                     " runs on '", me.host,
                     "': the shm backend connects ranks of one host only; use gloo or mpi "
                     "across hosts"));
      }
    }
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      const PeerInfo& p = peers[r];
      errno = 0;
      if (p.bytes != layout_.total) {
        fail(str_cat("rank ", r, "'s segment has ", p.bytes, " bytes, expected ", layout_.total,
                     " (do all ranks use the same C10D_SHM_HEAP_BYTES?)"));
      }
      const std::string path = str_cat("/proc/", p.pid, "/fd/", p.fd);
      int peer_fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
      if (peer_fd < 0) fail(str_cat("cannot open rank ", r, "'s segment at ", path));
      void* addr = ::mmap(nullptr, layout_.total, PROT_READ | PROT_WRITE,
                          MAP_SHARED | MAP_NORESERVE, peer_fd, 0);
      ::close(peer_fd);
      if (addr == MAP_FAILED) fail(str_cat("cannot map rank ", r, "'s segment"));
      bases_[r] = static_cast<char*>(addr);
      touch_control(r, /*write=*/false);
      if (header(r)->magic != kMagic || header(r)->rank != r) {
        errno = 0;
        fail(str_cat("rank ", r, "'s segment has an unexpected header"));
      }
      pids_[r] = p.pid;
      if (p.pid != me.pid) pidfds_[r] = open_pidfd(p.pid);
    }
  } catch (const DistBackendError&) {
    throw;
  } catch (const std::exception& e) {
    errno = 0;
    fail(str_cat("rendezvous through the store failed: ", e.what()));
  }
  // Everyone must have mapped every segment before the creators close their descriptors. The
  // wait goes through the segments, not the store: a rank that is done may already have taken
  // the store's server down.
  h->cma = probe_cma() ? 1 : 2;
  write_cpu_mask(h->cpu_mask);
  h->cpu.store(-1, std::memory_order_relaxed);
  h->mapped.store(1, std::memory_order_release);
  const core::Deadline deadline(timeout);
  for (int r = 0; r < size; ++r) {
    while (header(r)->mapped.load(std::memory_order_acquire) == 0) {
      errno = 0;
      if (std::string gone = peer_gone(r); !gone.empty()) {
        fail(str_cat("rank ", r, " ", gone, " before it mapped every segment"));
      }
      if (deadline.expired()) {
        fail(str_cat("rank ", r, " did not map the segments within ",
                     core::format_timeout(timeout)));
      }
      ::usleep(50);
    }
  }
  fd_ = fd;  // kept for aliases (alias.h); peers found theirs already
  cma_ = true;
  for (int r = 0; r < size; ++r) cma_ = cma_ && header(r)->cma == 1;
  int cpus = 0;
  for (size_t w = 0; w < std::size(h->cpu_mask); ++w) {
    uint64_t any = 0;
    for (int r = 0; r < size; ++r) any |= header(r)->cpu_mask[w];
    cpus += std::popcount(any);
  }
  cpus_ = std::max(1, cpus);
}

void Segment::touch_control(int r, bool write) const {
  char* base = bases_[r];
  touch_pages(base, layout_.slots, write);
  for (uint32_t parity = 0; parity < 2; ++parity) touch_pages(meta(r, parity), kMetaBytes, write);
  touch_pages(base + layout_.ring,
              layout_.channel_data + static_cast<size_t>(size_) * kChannelBytes - layout_.ring,
              write);
}

// Ranks that outnumber their CPUs each share one with others, and the scheduler decides which
// share: it sometimes ran three of four ranks on one of two CPUs for seconds. Pinned by rank,
// every CPU runs the same number of ranks (4 ranks on 2 CPUs, all_reduce of 4 MiB, medians of
// 15 timings: 824-884 us pinned, 912-1187 unpinned). A rank already pinned by someone else
// (taskset, mpirun --bind-to) keeps its mask: then no rank pins, as they all see the masks.
int Segment::bind_cpu() const {
  const bool automatic = core::env_string(core::kEnvShmBind) == "auto";
  if (automatic ? size_ <= cpus_ : !core::env_bool(core::kEnvShmBind)) return -1;
  const SegmentHeader* mine = header(0);
  for (int r = 1; r < size_; ++r) {
    if (!std::equal(std::begin(mine->cpu_mask), std::end(mine->cpu_mask),
                    std::begin(header(r)->cpu_mask))) {
      return -1;
    }
  }
  // The (rank mod cpus)-th CPU of the mask they share.
  int k = rank_ % cpus_;
  for (int c = 0; c < kMaxCpus; ++c) {
    if ((mine->cpu_mask[c / 64] >> (c % 64) & 1) == 0 || k-- > 0) continue;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(c, &set);
    return ::sched_setaffinity(0, sizeof set, &set) == 0 ? c : -1;
  }
  return -1;
}

bool Segment::probe_cma() const {
  if (!core::env_bool(core::kEnvShmCma)) return false;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    uint64_t magic = 0;
    iovec local{&magic, sizeof magic};
    iovec remote{reinterpret_cast<void*>(header(r)->self_address), sizeof magic};
    const ssize_t n = ::process_vm_readv(pids_[r], &local, 1, &remote, 1, 0);
    if (n != sizeof magic || magic != kMagic) {
      if (n < 0 && errno == EPERM) {
        // Usually Yama (kernel.yama.ptrace_scope >= 1), which lets a process read only the
        // memory of its descendants. Said once per process: it costs large messages a copy.
        static std::once_flag once;
        std::call_once(once, [&] {
          core::log(core::LogLevel::kWarning,
                    str_cat("shm: the kernel does not let rank ", rank_,
                            " read the memory of rank ", r, " (pid ", pids_[r],
                            ", EPERM; usually "
                            "kernel.yama.ptrace_scope >= 1), so large messages go through shared "
                            "memory, one more copy per byte. sysctl kernel.yama.ptrace_scope=0 "
                            "allows it; C10D_SHM_CMA=0 skips the check and this message."));
        });
      }
      return false;
    }
  }
  return true;
}

void Segment::read_peer(int r, void* local, uint64_t remote, size_t bytes) const {
  char* at = static_cast<char*>(local);
  while (bytes != 0) {  // resumed after partial copies
    iovec l{at, bytes};
    iovec rm{reinterpret_cast<void*>(remote), bytes};
    const ssize_t n = ::process_vm_readv(pid(r), &l, 1, &rm, 1, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      throw DistBackendError(str_cat("shm: reading the memory of rank ", r, " (pid ", pid(r),
                                     ") failed: ", n < 0 ? std::strerror(errno) : "no progress",
                                     "; set C10D_SHM_CMA=0 to copy through shared memory"));
    }
    at += n;
    remote += static_cast<uint64_t>(n);
    bytes -= static_cast<size_t>(n);
  }
}

void Segment::read_peer_buffer(int r, const PeerBuffer& b, char* dst, size_t off, size_t n) const {
  size_t lo = off + n;
  size_t hi = off + n;
  if (b.part != nullptr) {
    const char* heap_r = heap(r);
    if (b.hi < b.lo || b.part < heap_r || b.hi - b.lo > layout_.heap_bytes ||
        static_cast<size_t>(b.part - heap_r) > layout_.heap_bytes - (b.hi - b.lo)) {
      throw DistBackendError(str_cat("shm: rank ", r, " published a buffer outside its heap"));
    }
    lo = std::clamp(b.lo, off, off + n);
    hi = std::clamp(b.hi, lo, off + n);
  }
  if (lo > off) read_peer(r, dst, b.address + off, lo - off);
  if (hi > lo) core::copy_bytes(dst + (lo - off), b.part + (lo - b.lo), hi - lo);
  if (off + n > hi) read_peer(r, dst + (hi - off), b.address + hi, off + n - hi);
}

Segment::~Segment() {
  if (fd_ >= 0) ::close(fd_);
  for (int r = 0; r < size_; ++r) {
    if (bases_[r] != nullptr) ::munmap(bases_[r], layout_.total);
    if (pidfds_[r] >= 0) ::close(pidfds_[r]);
  }
}

int64_t Segment::heap_offset(const void* ptr, size_t bytes) const {
  const char* p = static_cast<const char*>(ptr);
  const char* h = heap(rank_);
  if (p < h || p + bytes > h + layout_.heap_bytes) return -1;
  return p - h;
}

std::string Segment::peer_gone(int r) const {
  if (header(r)->closed.load(std::memory_order_acquire) != 0) return "shut down its shm backend";
  if (pidfds_[r] >= 0) {
    pollfd pfd{pidfds_[r], POLLIN, 0};
    if (::poll(&pfd, 1, 0) > 0) return str_cat("exited (pid ", pids_[r], ")");
  } else if (pids_[r] != pids_[rank_]) {
    // No pidfd: a zombie still answers kill(pid, 0), so look at its state.
    std::string stat = read_first_line(str_cat("/proc/", pids_[r], "/stat").c_str());
    const size_t paren = stat.rfind(')');
    if (stat.empty() || (paren != std::string::npos && paren + 2 < stat.size() &&
                         (stat[paren + 2] == 'Z' || stat[paren + 2] == 'X'))) {
      return str_cat("exited (pid ", pids_[r], ")");
    }
  }
  return {};
}

}  // namespace c10d::backends::shm
