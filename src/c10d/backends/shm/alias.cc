#include "c10d/backends/shm/alias.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "c10d/backends/shm/segment.h"

namespace c10d::backends::shm {
namespace {

struct Alias {
  size_t len = 0;
  std::shared_ptr<Segment> segment;
  size_t heap_offset = 0;  // of the block in the segment's heap
  off_t file_offset = 0;   // of the block in the segment's memfd
  ino_t inode = 0;         // of the memfd
  bool forked = false;     // this process is a child that inherited the alias (see atfork_child)
  // Its owner no longer holds the memory, but some page may still map the block: kept for the
  // fork handlers, never used (forget_aliases_in).
  bool orphaned = false;
};

struct Registry {
  std::mutex mutex;
  std::map<uintptr_t, Alias> by_begin;  // guarded by mutex
  // by_begin.size(), readable without the mutex: find_alias, on every large collective, takes
  // the mutex only while some alias exists.
  std::atomic<size_t> entries{0};
  std::map<const Segment*, size_t> bytes_in_heap;  // of the aliases, per heap; guarded by mutex
  // Private copies of the aliased pages made for a fork in progress. Guarded by mutex.
  struct Snapshot {
    uintptr_t at = 0;
    size_t len = 0;
    void* copy = nullptr;  // null where the copy failed
    int fd = -1;           // the heap's memfd and the pages' offset in it
    off_t file_offset = 0;
  };
  std::vector<Snapshot> snapshots;
};

void atfork_prepare();
void atfork_parent();
void atfork_child();

// Never destroyed: weak-reference callbacks may release aliases while the process exits.
Registry& registry() {
  static Registry* const reg = [] {
    auto* r = new Registry;
    ::pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
    return r;
  }();
  return *reg;
}

std::vector<std::pair<uintptr_t, uintptr_t>> block_pages(uintptr_t begin, const Alias& alias);

// fork() with aliases: the parent copies each into fresh private memory before the fork (the
// snapshot), the child moves those copies over the aliases' addresses, and the parent drops
// its references to them, so the child ends up the only owner. (A copy in the child would race
// with the parent, which writes into the shared pages as soon as fork returns.) Of an orphaned
// alias only the pages /proc/self/maps still shows as the block's are copied: the rest may be
// unmapped. The parent may allocate here; the child (atfork_child) may not.
void atfork_prepare() {
  Registry& reg = registry();
  reg.mutex.lock();
  reg.snapshots.clear();
  for (const auto& [begin, alias] : reg.by_begin) {
    if (alias.forked) continue;
    const auto ranges =
        alias.orphaned ? block_pages(begin, alias)
                       : std::vector<std::pair<uintptr_t, uintptr_t>>{{begin, begin + alias.len}};
    for (const auto& [lo, hi] : ranges) {
      Registry::Snapshot snap{.at = lo,
                              .len = hi - lo,
                              .fd = alias.segment->own_fd(),
                              .file_offset = alias.file_offset + static_cast<off_t>(lo - begin)};
      void* copy =
          ::mmap(nullptr, snap.len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (copy != MAP_FAILED) {
        std::memcpy(copy, reinterpret_cast<const void*>(lo), snap.len);
        snap.copy = copy;
      }
      reg.snapshots.push_back(snap);
    }
  }
}

void atfork_parent() {
  Registry& reg = registry();
  for (const Registry::Snapshot& snap : reg.snapshots) {
    if (snap.copy != nullptr) ::munmap(snap.copy, snap.len);
  }
  reg.snapshots.clear();
  reg.mutex.unlock();
}

// Only system calls here: the child of a threaded process may not allocate. Where a snapshot
// is missing, the child maps the heap's pages copy-on-write instead, which at least keeps its
// writes to itself.
void atfork_child() {
  Registry& reg = registry();
  for (const Registry::Snapshot& snap : reg.snapshots) {
    void* at = reinterpret_cast<void*>(snap.at);
    if (snap.copy == nullptr ||
        ::mremap(snap.copy, snap.len, snap.len, MREMAP_MAYMOVE | MREMAP_FIXED, at) == MAP_FAILED) {
      ::mmap(at, snap.len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, snap.fd,
             snap.file_offset);
    }
  }
  for (auto& [begin, alias] : reg.by_begin) alias.forked = true;
  reg.mutex.unlock();
}

size_t page_size() {
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

// The whole pages of [data, data + bytes) as [begin, end); empty when there are none.
void whole_pages(const void* data, size_t bytes, uintptr_t& begin, uintptr_t& end) {
  const size_t page = page_size();
  const auto p = reinterpret_cast<uintptr_t>(data);
  begin = (p + page - 1) / page * page;
  end = (p + bytes) / page * page;
  if (end < begin) end = begin;
}

struct Mapping {
  uintptr_t start = 0;
  uintptr_t end = 0;
  char perms[5] = {};
  uint64_t offset = 0;
  uint64_t inode = 0;
  std::string path;
};

// The lines of /proc/self/maps that overlap [begin, end), in address order.
std::vector<Mapping> mappings_over(uintptr_t begin, uintptr_t end) {
  std::vector<Mapping> out;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    Mapping m;
    int path_at = 0;
    if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR " %4s %" SCNx64 " %*s %" SCNu64 " %n",
                    &m.start, &m.end, m.perms, &m.offset, &m.inode, &path_at) < 5) {
      continue;
    }
    if (m.end <= begin) continue;
    if (m.start >= end) break;
    if (path_at > 0) m.path = line.substr(static_cast<size_t>(path_at));
    out.push_back(std::move(m));
  }
  return out;
}

// Whether [begin, end) is wholly private anonymous read-write memory (malloc's: mmap'd chunks
// or the brk heap).
bool private_anonymous(uintptr_t begin, uintptr_t end) {
  uintptr_t covered = begin;
  for (const Mapping& m : mappings_over(begin, end)) {
    if (m.start > covered) return false;  // a hole
    if (std::strcmp(m.perms, "rw-p") != 0 || m.inode != 0) return false;
    if (!m.path.empty() && m.path != "[heap]") return false;
    covered = m.end;
  }
  return covered >= end;
}

// Maps fresh private anonymous memory over [at, at + len). False when that failed: the old
// mapping may then still be there.
bool make_private(uintptr_t at, size_t len) {
  // Built aside and moved in with mremap, which replaces the old mapping in one step: a
  // failing mmap(MAP_FIXED) may already have unmapped it, leaving a hole.
  void* tmp = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (tmp == MAP_FAILED) return false;
  void* got = ::mremap(tmp, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, reinterpret_cast<void*>(at));
  if (got == MAP_FAILED) {
    ::munmap(tmp, len);
    return false;
  }
  return true;
}

// Gives the block's pages back to the system and the block to the heap.
void free_block(const Alias& alias) {
  ::fallocate(alias.segment->own_fd(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
              alias.file_offset, static_cast<off_t>(alias.len));
  alias.segment->own_heap().release(alias.heap_offset, alias.len);
}

// The parts of [begin, begin + alias.len) that /proc/self/maps shows as still mapped from the
// alias's block, at the offsets adoption gave them; pages unmapped (and perhaps reused) since
// must never be touched.
std::vector<std::pair<uintptr_t, uintptr_t>> block_pages(uintptr_t begin, const Alias& alias) {
  std::vector<std::pair<uintptr_t, uintptr_t>> out;
  const uintptr_t end = begin + alias.len;
  for (const Mapping& m : mappings_over(begin, end)) {
    if (m.inode != alias.inode) continue;
    const uintptr_t lo = std::max(m.start, begin);
    const uintptr_t hi = std::min(m.end, end);
    if (m.offset + (lo - m.start) == static_cast<uint64_t>(alias.file_offset) + (lo - begin)) {
      out.emplace_back(lo, hi);
    }
  }
  return out;
}

// Drops a record (registry locked). Its block goes back to the heap once no page maps it; the
// pages that still do get fresh private memory when `unmap`, else the record stays, orphaned.
void drop(Registry& reg, std::map<uintptr_t, Alias>::iterator it, bool unmap) {
  Alias& alias = it->second;
  if (alias.forked) {
    reg.by_begin.erase(it);
    return;
  }
  bool mapped = false;
  for (const auto& [lo, hi] : block_pages(it->first, alias)) {
    mapped = !unmap || !make_private(lo, hi - lo) || mapped;
  }
  if (mapped) {
    alias.orphaned = true;
    return;
  }
  free_block(alias);
  reg.bytes_in_heap[alias.segment.get()] -= alias.len;
  reg.by_begin.erase(it);
}

// Drops the records of aliases that begin inside [data, data + bytes) (registry locked).
void drop_in(const void* data, size_t bytes, bool unmap) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  const auto p = reinterpret_cast<uintptr_t>(data);
  for (auto it = reg.by_begin.lower_bound(p); it != reg.by_begin.end() && it->first < p + bytes;) {
    auto next = std::next(it);
    if (it->first + it->second.len <= p + bytes) drop(reg, it, unmap);
    it = next;
  }
  reg.entries.store(reg.by_begin.size(), std::memory_order_release);
}

// /proc/self/pagemap of this process (reopened in a fork child, where the inherited descriptor
// still shows the parent); -1 when it cannot be read. Lock-free once open: every large
// collective on an alias reads it.
int pagemap_fd() {
  static std::atomic<int> fd{-1};
  static std::atomic<pid_t> owner{0};
  static std::mutex mutex;
  const pid_t pid = ::getpid();
  if (owner.load(std::memory_order_acquire) == pid) return fd.load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(mutex);
  if (owner.load(std::memory_order_relaxed) != pid) {
    const int old = fd.exchange(::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC));
    if (old >= 0) ::close(old);
    owner.store(pid, std::memory_order_release);
  }
  return fd.load(std::memory_order_relaxed);
}

// Whether the page of `at`, a byte of a live buffer of the caller's, is a shared or file page: an
// alias's pages are; memory numpy freed and allocated again is private.
bool shared_page(int fd, uintptr_t at) {
  constexpr uint64_t kPresent = uint64_t{1} << 63;
  constexpr uint64_t kFileOrShared = uint64_t{1} << 61;
  // Reading a byte faults the page in, so that pagemap describes it.
  (void)*reinterpret_cast<const volatile char*>(at);
  uint64_t entry = 0;
  const off_t where = static_cast<off_t>(at / page_size() * sizeof(entry));
  if (::pread(fd, &entry, sizeof(entry), where) != static_cast<ssize_t>(sizeof(entry))) {
    return false;
  }
  return (entry & kPresent) != 0 && (entry & kFileOrShared) != 0;
}

}  // namespace

bool adopt_into_heap(const std::shared_ptr<Segment>& segment, void* data, size_t bytes) {
  uintptr_t begin, end;
  whole_pages(data, bytes, begin, end);
  // Only such blocks start on a page, as mmap needs.
  if (end - begin < kPageAlignedBlockBytes) return false;
  const size_t len = end - begin;
  struct stat st {};
  if (::fstat(segment->own_fd(), &st) != 0 || pagemap_fd() < 0) return false;

  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  // Records over these pages whose block no page maps any more are stale: dropped here.
  auto first = reg.by_begin.lower_bound(begin);
  if (first != reg.by_begin.begin() &&
      std::prev(first)->first + std::prev(first)->second.len > begin) {
    --first;
  }
  for (auto it = first; it != reg.by_begin.end() && it->first < end;) {
    auto next = std::next(it);
    if (it->second.forked || !block_pages(it->first, it->second).empty()) return false;
    drop(reg, it, /*unmap=*/false);
    it = next;
  }
  reg.entries.store(reg.by_begin.size(), std::memory_order_release);
  // Aliases take at most half of a heap, so shm_empty() keeps room.
  size_t& in_heap = reg.bytes_in_heap[segment.get()];
  if (in_heap + len > segment->layout().heap_bytes / 2) return false;
  if (!private_anonymous(begin, end)) return false;
  const std::optional<size_t> offset = segment->own_heap().try_allocate(len);
  if (!offset) return false;
  Alias alias{.len = len,
              .segment = segment,
              .heap_offset = *offset,
              .file_offset = static_cast<off_t>(segment->layout().heap + *offset),
              .inode = st.st_ino};
  char* block = segment->heap(segment->rank()) + *offset;
  std::memcpy(block, reinterpret_cast<const void*>(begin), len);
  // Map the block somewhere, then move that mapping over the buffer's pages in one step
  // (mremap), so the buffer never lacks its pages.
  void* shared = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                        segment->own_fd(), alias.file_offset);
  if (shared == MAP_FAILED) {
    free_block(alias);
    return false;
  }
  if (::mremap(shared, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, reinterpret_cast<void*>(begin)) ==
      MAP_FAILED) {
    ::munmap(shared, len);
    free_block(alias);
    return false;
  }
  reg.by_begin.emplace(begin, std::move(alias));
  reg.entries.store(reg.by_begin.size(), std::memory_order_release);
  in_heap += len;
  return true;
}

void release_aliases_in(const void* data, size_t bytes) { drop_in(data, bytes, /*unmap=*/true); }

void forget_aliases_in(const void* data, size_t bytes) { drop_in(data, bytes, /*unmap=*/false); }

AliasedPart find_alias(const Segment& segment, const void* data, size_t bytes, bool verify) {
  const auto p = reinterpret_cast<uintptr_t>(data);
  Registry& reg = registry();
  if (bytes == 0 || reg.entries.load(std::memory_order_acquire) == 0) return {};
  std::lock_guard<std::mutex> lock(reg.mutex);
  auto it = reg.by_begin.upper_bound(p + bytes - 1);
  if (it == reg.by_begin.begin()) return {};
  --it;
  const Alias& alias = it->second;
  if (alias.forked || alias.orphaned || alias.segment.get() != &segment) return {};
  const uintptr_t lo = std::max(it->first, p);
  const uintptr_t hi = std::min(it->first + alias.len, p + bytes);
  if (hi <= lo) return {};
  // Memory freed and mapped again at these addresses is private: the record is stale.
  const int fd = verify ? pagemap_fd() : 0;
  if (verify && (fd < 0 || !shared_page(fd, lo) || !shared_page(fd, hi - 1))) {
    drop(reg, it, /*unmap=*/false);
    reg.entries.store(reg.by_begin.size(), std::memory_order_release);
    return {};
  }
  return {.lo = lo - p, .hi = hi - p, .heap_offset = alias.heap_offset + (lo - it->first)};
}

AliasedPart mapped_part(const Segment& segment, const void* data, size_t bytes) {
  const int64_t heap = segment.heap_offset(data, bytes);
  if (heap >= 0) return {.lo = 0, .hi = bytes, .heap_offset = static_cast<size_t>(heap)};
  return find_alias(segment, data, bytes);
}

size_t alias_count() {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  size_t n = 0;
  for (const auto& [begin, alias] : reg.by_begin) n += alias.forked ? 0 : 1;
  return n;
}

}  // namespace c10d::backends::shm
