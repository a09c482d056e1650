#include "c10d/store/file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <system_error>
#include <thread>
#include <utility>

#include "c10d/core/exception.h"

namespace c10d::store {

using core::detail::str_cat;

namespace {

// File layout: the 8-byte magic, then records. A record is
//   [op: u8][key length: u32][value length: u32][key bytes][value bytes]
// with lengths in host byte order (the file is shared between processes of one host).
constexpr char kMagic[8] = {'c', '1', '0', 'd', 'F', 'S', '1', '\n'};
constexpr off_t kMagicSize = sizeof(kMagic);
constexpr size_t kRecordHeaderSize = 1 + 4 + 4;

enum Op : uint8_t {
  kSet = 1,        // key = value
  kAppend = 2,     // key += value (created empty when missing)
  kDelete = 3,     // tombstone: key is gone
  kQueuePush = 4,  // push value at the back of queue key
  kQueuePop = 5,   // drop the front of queue key
  kJoin = 6,       // a user opened the file; value is one byte, the role
  kLeave = 7,      // a user closed the file; value is one byte, the role
};

constexpr Millis kFirstBackoff{1};
constexpr Millis kMaxBackoff{16};

std::string errno_text(int err) { return std::generic_category().message(err); }

void put_u32(Bytes& out, uint32_t v) {
  uint8_t raw[4];
  std::memcpy(raw, &v, sizeof(v));
  out.insert(out.end(), raw, raw + 4);
}

uint32_t get_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Calls `attempt(first)` until it returns true or the deadline passes, sleeping with a growing
// backoff in between. Returns false on timeout. `attempt` is always called at least once and
// once more after the deadline's last sleep, so a key that arrives just in time is seen.
template <typename Attempt>
bool poll_until(const core::Deadline& deadline, Attempt&& attempt) {
  Millis backoff = kFirstBackoff;
  for (bool first = true;; first = false) {
    if (attempt(first)) return true;
    if (deadline.expired()) return false;
    std::this_thread::sleep_for(std::min(backoff, deadline.remaining()));
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
}

}  // namespace

struct FileStore::Record {
  uint8_t op;
  std::string key;
  Bytes value;
};

// Holds flock on the store's descriptor for one scope. flock (unlike fcntl record locks)
// belongs to the open file description, so two FileStore handles in one process, each with
// its own descriptor, exclude each other as two processes would. Taking the lock is bounded
// by the store's timeout: a process stuck while holding it becomes an error, not a hang.
class FileStore::FileLock {
 public:
  FileLock(const FileStore& store, bool exclusive) : fd_(store.fd_) {
    const core::Deadline deadline(store.timeout());
    auto pause = std::chrono::microseconds(100);
    while (::flock(fd_, (exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB) != 0) {
      if (errno == EINTR) continue;
      if (errno != EWOULDBLOCK) {
        store.throw_errno(exclusive ? "flock(LOCK_EX)" : "flock(LOCK_SH)", errno);
      }
      if (deadline.expired()) {
        throw core::DistStoreTimeoutError(core::detail::str_cat(
            store.describe(), ": timed out after ", core::format_timeout(store.timeout()),
            " waiting for the file lock (another process holds it)"));
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(10000));
    }
  }
  ~FileLock() { ::flock(fd_, LOCK_UN); }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_;
};

FileStore::FileStore(std::string path, int num_workers, Millis timeout)
    : FileStore(std::move(path), num_workers, timeout, Role::kWorker) {}

FileStore::FileStore(std::string path, int num_workers, Millis timeout, Role role)
    : Store(timeout), path_(std::move(path)), num_workers_(num_workers), role_(role),
      owner_pid_(::getpid()) {
  C10D_CHECK_ARG(!path_.empty(), "FileStore: the file path is empty");
  std::lock_guard<std::mutex> guard(mutex_);
  try {
    open_and_join();
  } catch (...) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    throw;
  }
}

FileStore::~FileStore() {
  std::lock_guard<std::mutex> guard(mutex_);
  if (fd_ < 0) return;
  // A handle inherited through fork() shares the parent's descriptor; its join is the
  // parent's to undo, so the child only lets go of the descriptor.
  if (::getpid() == owner_pid_) {
    try {
      FileLock lock(*this, /*exclusive=*/true);
      sync(/*exclusive=*/true);
      write_records({Record{kLeave, {}, Bytes{static_cast<uint8_t>(role_)}}});
      const bool nobody_left = live_workers_ + live_clones_ <= 0;
      // Without a fixed number of workers the file stays, as with torch: processes that use
      // it one after another find what the earlier ones wrote.
      const bool all_finished = num_workers_ > 0 && left_workers_ >= num_workers_;
      if (nobody_left && all_finished) {
        // Remove the name only if it still points at our file. Holding the lock while
        // unlinking makes a concurrent opener notice (link count 0) and start a new file.
        struct stat own {
        }, named{};
        if (::fstat(fd_, &own) == 0 && ::stat(path_.c_str(), &named) == 0 &&
            own.st_ino == named.st_ino && own.st_dev == named.st_dev &&
            ::unlink(path_.c_str()) != 0) {
          std::fprintf(stderr, "%s: unlink failed: %s\n", describe().c_str(),
                       errno_text(errno).c_str());
        }
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: failed to record leaving the store: %s\n", describe().c_str(),
                   e.what());
    }
  }
  ::close(fd_);
  fd_ = -1;
}

void FileStore::open_and_join() {
  while (true) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw_errno("open", errno);
    pos_ = 0;
    synced_size_ = 0;
    kv_.clear();
    queues_.clear();
    live_workers_ = live_clones_ = left_workers_ = 0;

    {
      FileLock lock(*this, /*exclusive=*/true);
      struct stat own {
      }, named{};
      if (::fstat(fd_, &own) != 0) throw_errno("fstat", errno);
      bool same_file = false;
      if (::stat(path_.c_str(), &named) == 0) {
        same_file = own.st_ino == named.st_ino && own.st_dev == named.st_dev;
      } else if (errno != ENOENT) {
        throw_errno("stat", errno);
      }
      if (own.st_nlink > 0 && same_file) {
        sync(/*exclusive=*/true);
        if (pos_ == 0) {
          // A new (or emptied) file: this handle writes the magic.
          off_t done = 0;
          while (done < kMagicSize) {
            ssize_t n = ::pwrite(fd_, kMagic + done, kMagicSize - done, done);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) throw_errno("write", errno);
            done += n;
          }
          pos_ = synced_size_ = kMagicSize;
        }
        write_records({Record{kJoin, {}, Bytes{static_cast<uint8_t>(role_)}}});
        return;
      }
    }
    // The last user removed this file between our open() and flock(): start over on a new
    // file at the same path.
    ::close(fd_);
    fd_ = -1;
  }
}

void FileStore::throw_errno(const char* what, int err) const {
  throw core::DistStoreError(
      str_cat(describe(), ": ", what, " on '", path_, "' failed: ", errno_text(err)));
}

void FileStore::check_owner() const {
  if (::getpid() != owner_pid_) {
    throw core::DistStoreError(str_cat(
        describe(), ": this handle was created in process ", owner_pid_,
        " and cannot be used after fork(); open a new FileStore (or clone()) in the child"));
  }
}

void FileStore::sync(bool exclusive) {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) throw_errno("fstat", errno);
  const off_t size = st.st_size;
  if (size < pos_) {
    throw core::DistStoreError(str_cat(describe(), ": the file shrank from ", pos_, " to ", size,
                                       " bytes; was it modified by something other than "
                                       "FileStore?"));
  }
  if (size == pos_) {
    synced_size_ = size;
    return;
  }

  Bytes buf(static_cast<size_t>(size - pos_));
  size_t got = 0;
  while (got < buf.size()) {
    ssize_t n = ::pread(fd_, buf.data() + got, buf.size() - got, pos_ + static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno("read", errno);
    if (n == 0) break;  // cannot happen under the lock; treat the rest as a torn tail
    got += static_cast<size_t>(n);
  }

  size_t cursor = 0;
  bool torn = false;
  if (pos_ == 0) {
    const size_t have = std::min(got, static_cast<size_t>(kMagicSize));
    if (std::memcmp(buf.data(), kMagic, have) != 0) {
      throw core::DistStoreError(
          str_cat(describe(), ": '", path_, "' exists but is not a FileStore file"));
    }
    if (have < static_cast<size_t>(kMagicSize)) {
      torn = true;
    } else {
      cursor = kMagicSize;
      pos_ = kMagicSize;
    }
  }

  while (!torn && cursor < got) {
    if (got - cursor < kRecordHeaderSize) {
      torn = true;
      break;
    }
    const uint8_t* head = buf.data() + cursor;
    const uint8_t op = head[0];
    const size_t key_len = get_u32(head + 1);
    const size_t value_len = get_u32(head + 5);
    if (op < kSet || op > kLeave) {
      throw core::DistStoreError(str_cat(describe(), ": corrupt record (op ", int(op),
                                         ") at offset ", pos_, " of '", path_, "'"));
    }
    const size_t total = kRecordHeaderSize + key_len + value_len;
    if (got - cursor < total) {
      torn = true;
      break;
    }
    const uint8_t* body = head + kRecordHeaderSize;
    Record record{op, std::string(reinterpret_cast<const char*>(body), key_len),
                  Bytes(body + key_len, body + key_len + value_len)};
    apply(record);
    cursor += total;
    pos_ += static_cast<off_t>(total);
  }

  off_t now = size;
  if (torn && exclusive) {
    // Writers append whole records under the exclusive lock, which we now hold, so a partial
    // record can only come from a writer that died mid-write. Cut it off before appending.
    if (::ftruncate(fd_, pos_) != 0) throw_errno("ftruncate", errno);
    now = pos_;
  }
  synced_size_ = now;
}

void FileStore::write_records(const std::vector<Record>& records) {
  Bytes buf;
  for (const auto& r : records) {
    constexpr size_t kMax = std::numeric_limits<uint32_t>::max();
    C10D_CHECK_T(core::InvalidArgument, r.key.size() <= kMax && r.value.size() <= kMax, describe(),
                 ": key '", r.key.substr(0, 64), "' or its value exceeds 4 GiB");
    buf.push_back(r.op);
    put_u32(buf, static_cast<uint32_t>(r.key.size()));
    put_u32(buf, static_cast<uint32_t>(r.value.size()));
    buf.insert(buf.end(), r.key.begin(), r.key.end());
    buf.insert(buf.end(), r.value.begin(), r.value.end());
  }
  size_t done = 0;
  while (done < buf.size()) {
    ssize_t n =
        ::pwrite(fd_, buf.data() + done, buf.size() - done, pos_ + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      // Leave no torn record behind for the next writer (best effort: it also cuts them).
      if (::ftruncate(fd_, pos_) != 0) { /* the next exclusive sync trims it */
      }
      throw_errno("write", err);
    }
    done += static_cast<size_t>(n);
  }
  for (const auto& r : records) apply(r);
  pos_ += static_cast<off_t>(buf.size());
  synced_size_ = pos_;
}

void FileStore::apply(const Record& r) {
  switch (r.op) {
    case kSet:
      kv_[r.key] = r.value;
      break;
    case kAppend: {
      Bytes& v = kv_[r.key];
      v.insert(v.end(), r.value.begin(), r.value.end());
      break;
    }
    case kDelete:
      kv_.erase(r.key);
      break;
    case kQueuePush:
      queues_[r.key].push_back(r.value);
      break;
    case kQueuePop: {
      auto it = queues_.find(r.key);
      if (it != queues_.end()) {
        if (!it->second.empty()) it->second.pop_front();
        if (it->second.empty()) queues_.erase(it);
      }
      break;
    }
    case kJoin:
    case kLeave: {
      const bool worker = !r.value.empty() && r.value[0] == static_cast<uint8_t>(Role::kWorker);
      const int64_t step = r.op == kJoin ? 1 : -1;
      if (worker) {
        live_workers_ += step;
        if (r.op == kLeave) ++left_workers_;
      } else {
        live_clones_ += step;
      }
      break;
    }
    default:
      break;  // rejected by sync() before getting here
  }
}

void FileStore::refresh(bool force) {
  if (!force && !changed_since_sync()) return;
  FileLock lock(*this, /*exclusive=*/false);
  sync(/*exclusive=*/false);
}

bool FileStore::changed_since_sync() {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) throw_errno("fstat", errno);
  return st.st_size != synced_size_;
}

bool FileStore::all_present(const std::vector<std::string>& keys) const {
  // A non-empty queue counts as a present key, as in the other stores.
  return std::all_of(keys.begin(), keys.end(), [this](const std::string& k) {
    if (kv_.count(k) != 0) return true;
    auto it = queues_.find(k);
    return it != queues_.end() && !it->second.empty();
  });
}

void FileStore::set(const std::string& key, const Bytes& value) {
  check_owner();
  std::lock_guard<std::mutex> guard(mutex_);
  FileLock lock(*this, true);
  sync(true);
  write_records({Record{kSet, key, value}});
}

Bytes FileStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  check_owner();
  std::lock_guard<std::mutex> guard(mutex_);
  FileLock lock(*this, true);
  sync(true);
  auto it = kv_.find(key);
  if (it == kv_.end()) {
    if (!expected.empty()) return expected;
  } else if (it->second != expected) {
    return it->second;
  }
  write_records({Record{kSet, key, desired}});
  return desired;
}

Bytes FileStore::get(const std::string& key) {
  check_owner();
  const Millis timeout = this->timeout();
  Bytes value;
  const bool found = poll_until(key_deadline(timeout), [&](bool first) {
    std::lock_guard<std::mutex> guard(mutex_);
    refresh(first);
    auto it = kv_.find(key);
    if (it == kv_.end()) return false;
    value = it->second;
    return true;
  });
  if (!found) throw_wait_timeout(describe(), {key}, timeout);
  return value;
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  check_owner();
  std::lock_guard<std::mutex> guard(mutex_);
  FileLock lock(*this, true);
  sync(true);
  int64_t value = 0;
  if (auto it = kv_.find(key); it != kv_.end()) value = parse_counter(key, it->second);
  C10D_CHECK_T(core::DistStoreError, !__builtin_add_overflow(value, delta, &value), describe(),
               ": add on key '", key, "' overflows int64 (", value, " + ", delta, ")");
  write_records({Record{kSet, key, to_bytes(std::to_string(value))}});
  return value;
}

bool FileStore::delete_key(const std::string& key) {
  check_owner();
  std::lock_guard<std::mutex> guard(mutex_);
  FileLock lock(*this, true);
  sync(true);
  if (kv_.count(key) == 0) return false;
  write_records({Record{kDelete, key, {}}});
  return true;
}

bool FileStore::check(const std::vector<std::string>& keys) {
  check_owner();
  std::lock_guard<std::mutex> guard(mutex_);
  FileLock lock(*this, false);
  sync(false);
  return all_present(keys);
}

int64_t FileStore::num_keys() {
  check_owner();
  std::lock_guard<std::mutex> guard(mutex_);
  FileLock lock(*this, false);
  sync(false);
  return static_cast<int64_t>(kv_.size());
}

void FileStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  check_owner();
  const bool found = poll_until(key_deadline(timeout), [&](bool first) {
    std::lock_guard<std::mutex> guard(mutex_);
    refresh(first);
    return all_present(keys);
  });
  if (!found) throw_wait_timeout(describe(), keys, timeout);
}

void FileStore::append(const std::string& key, const Bytes& value) {
  check_owner();
  std::lock_guard<std::mutex> guard(mutex_);
  FileLock lock(*this, true);
  sync(true);
  write_records({Record{kAppend, key, value}});
}

std::vector<Bytes> FileStore::multi_get(const std::vector<std::string>& keys) {
  check_owner();
  const Millis timeout = this->timeout();
  std::vector<Bytes> values;
  const bool found = poll_until(key_deadline(timeout), [&](bool first) {
    std::lock_guard<std::mutex> guard(mutex_);
    refresh(first);
    if (!all_present(keys)) return false;
    values.clear();
    values.reserve(keys.size());
    for (const auto& key : keys) values.push_back(kv_.at(key));
    return true;
  });
  if (!found) throw_wait_timeout(describe(), keys, timeout);
  return values;
}

void FileStore::multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  C10D_CHECK_ARG_EQ(keys.size(), values.size(), "multi_set: keys and values differ in length");
  check_owner();
  if (keys.empty()) return;
  std::vector<Record> records;
  records.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) records.push_back(Record{kSet, keys[i], values[i]});
  std::lock_guard<std::mutex> guard(mutex_);
  FileLock lock(*this, true);
  sync(true);
  write_records(records);
}

void FileStore::queue_push(const std::string& key, const Bytes& value) {
  check_owner();
  std::lock_guard<std::mutex> guard(mutex_);
  FileLock lock(*this, true);
  sync(true);
  write_records({Record{kQueuePush, key, value}});
}

Bytes FileStore::queue_pop(const std::string& key, bool block) {
  check_owner();
  const Millis timeout = block ? this->timeout() : Millis(1);
  Bytes value;
  auto try_pop = [&](bool first) {
    std::lock_guard<std::mutex> guard(mutex_);
    if (!first && !changed_since_sync()) {
      // Nothing new in the file; the cache (which another thread's push on this handle may
      // have updated) is current, so only an empty queue lets us skip the exclusive lock.
      auto it = queues_.find(key);
      if (it == queues_.end() || it->second.empty()) return false;
    }
    FileLock lock(*this, true);
    sync(true);
    auto it = queues_.find(key);
    if (it == queues_.end() || it->second.empty()) return false;
    value = it->second.front();
    write_records({Record{kQueuePop, key, {}}});
    return true;
  };
  if (!block) {
    if (!try_pop(true)) {
      throw core::DistQueueEmptyError(
          str_cat(describe(), ": queue_pop on empty queue '", key, "'"));
    }
    return value;
  }
  if (!poll_until(key_deadline(timeout), try_pop)) {
    throw_wait_timeout(describe(), {key}, timeout);
  }
  return value;
}

int64_t FileStore::queue_len(const std::string& key) {
  check_owner();
  std::lock_guard<std::mutex> guard(mutex_);
  FileLock lock(*this, false);
  sync(false);
  auto it = queues_.find(key);
  return it == queues_.end() ? 0 : static_cast<int64_t>(it->second.size());
}

std::vector<std::string> FileStore::list_keys() {
  check_owner();
  std::lock_guard<std::mutex> guard(mutex_);
  FileLock lock(*this, false);
  sync(false);
  std::vector<std::string> keys;
  keys.reserve(kv_.size());
  for (const auto& [key, value] : kv_) keys.push_back(key);
  std::sort(keys.begin(), keys.end());
  return keys;
}

std::shared_ptr<Store> FileStore::clone() {
  // Allowed after fork(): the clone opens its own descriptor and joins as a new user.
  return std::shared_ptr<Store>(new FileStore(path_, num_workers_, timeout(), Role::kClone));
}

}  // namespace c10d::store
