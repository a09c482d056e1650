#include "c10d/store/file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>

#include "c10d/core/exception.h"

namespace c10d::store {

using core::detail::str_cat;

namespace {

// torch's file layout, so that torch and c10d processes share one file: records
//   [key length: u32][key bytes][value length: u32][value bytes]
// (host byte order, no header), replayed in order. The key says what a record does:
//   "/" + key         the user key's whole new value (set, add, append, compare_set)
//   "-" + "/" + key   the user key is deleted
//   "refcount/"       handles open on the file (ASCII decimal; +1 on open, -1 on close)
//   "cleanup/"        workers that closed their handle (ASCII decimal)
// and, c10d's own (torch keeps them as entries of its cache, harmlessly):
//   "queue+/" + key   value pushed at the back of queue key
//   "queue-/" + key   the front of queue key dropped
constexpr std::string_view kUserPrefix = "/";
constexpr char kDeleteMark = '-';
constexpr std::string_view kRefcountKey = "refcount/";
constexpr std::string_view kCleanupKey = "cleanup/";
constexpr std::string_view kPushPrefix = "queue+/";
constexpr std::string_view kPopPrefix = "queue-/";

std::string user_key(const std::string& key) { return str_cat(kUserPrefix, key); }

bool known_record(const std::string& key) {
  return key.starts_with(kUserPrefix) || (!key.empty() && key.front() == kDeleteMark) ||
         key == kRefcountKey || key == kCleanupKey || key.starts_with(kPushPrefix) ||
         key.starts_with(kPopPrefix);
}

// Whether the `size` bytes at the start of a file can begin a "refcount/" record.
bool starts_a_store(const uint8_t* data, size_t size) {
  uint8_t head[4 + kRefcountKey.size()];
  const auto len = static_cast<uint32_t>(kRefcountKey.size());
  std::memcpy(head, &len, 4);
  std::memcpy(head + 4, kRefcountKey.data(), kRefcountKey.size());
  return std::memcmp(data, head, std::min(size, sizeof head)) == 0;
}

// A handle counter's value (ASCII decimal; torch reads an empty one as 0).
int64_t counter_value(const Bytes& value) {
  int64_t n = 0;
  const char* first = reinterpret_cast<const char*>(value.data());
  std::from_chars(first, first + value.size(), n);
  return n;
}

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
  std::string key;  // as in the file ("/" + the user's key, ...)
  Bytes value;
};

FileStore::Record FileStore::counter_record(std::string_view key, int64_t value) {
  return {std::string(key), to_bytes(std::to_string(value))};
}

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
      // As torch's handles: a worker counts itself finished, then every handle lets go.
      std::vector<Record> leaving;
      if (role_ == Role::kWorker) leaving.push_back(counter_record(kCleanupKey, cleanup_ + 1));
      leaving.push_back(counter_record(kRefcountKey, refcount_ - 1));
      write_records(leaving);
      const bool nobody_left = refcount_ <= 0;
      // Without a fixed number of workers (negative) the file stays, as with torch: processes
      // that use it one after another find what the earlier ones wrote.
      const bool all_finished = num_workers_ >= 0 && cleanup_ >= num_workers_;
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
    refcount_ = cleanup_ = 0;
    has_cleanup_ = false;

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
        write_records({counter_record(kRefcountKey, refcount_ + 1)});
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
  while (cursor < got) {
    const uint8_t* head = buf.data() + cursor;
    const size_t left = got - cursor;
    // The first record of every FileStore file (torch's or c10d's) is a handle's "refcount/":
    // anything else there is somebody else's file, which is never cut or written to.
    if (pos_ == 0 && !starts_a_store(head, left)) {
      // c10d's FileStores wrote a format of their own, under this magic, before torch's.
      constexpr std::string_view kOwnFormat = "c10dFS1\n";
      const bool older =
          left >= kOwnFormat.size() && std::memcmp(head, kOwnFormat.data(), kOwnFormat.size()) == 0;
      throw core::DistStoreError(
          str_cat(describe(), ": '", path_, "' exists but is not a FileStore file",
                  older ? " (an earlier c10d wrote it in a format of its own; FileStores now use "
                          "torch's: remove the file, or use a fresh path per run)"
                        : ""));
    }
    if (left < 4) {
      torn = true;
      break;
    }
    const size_t key_len = get_u32(head);
    if (left < 4 + key_len + 4) {
      torn = true;
      break;
    }
    const size_t value_len = get_u32(head + 4 + key_len);
    const size_t total = 4 + key_len + 4 + value_len;
    if (left < total) {
      torn = true;
      break;
    }
    Record record{std::string(reinterpret_cast<const char*>(head + 4), key_len),
                  Bytes(head + 8 + key_len, head + total)};
    if (!known_record(record.key)) {
      throw core::DistStoreError(str_cat(describe(), ": corrupt record (key '",
                                         record.key.substr(0, 64), "') at offset ", pos_, " of '",
                                         path_, "'"));
    }
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
    put_u32(buf, static_cast<uint32_t>(r.key.size()));
    buf.insert(buf.end(), r.key.begin(), r.key.end());
    put_u32(buf, static_cast<uint32_t>(r.value.size()));
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
  const std::string& key = r.key;
  if (key.starts_with(kUserPrefix)) {
    kv_[key.substr(kUserPrefix.size())] = r.value;
  } else if (key.front() == kDeleteMark) {
    if (std::string_view(key).substr(1).starts_with(kUserPrefix)) {
      kv_.erase(key.substr(1 + kUserPrefix.size()));
    }
  } else if (key == kRefcountKey) {
    refcount_ = counter_value(r.value);
  } else if (key == kCleanupKey) {
    cleanup_ = counter_value(r.value);
    has_cleanup_ = true;
  } else if (key.starts_with(kPushPrefix)) {
    queues_[key.substr(kPushPrefix.size())].push_back(r.value);
  } else if (key.starts_with(kPopPrefix)) {
    auto it = queues_.find(key.substr(kPopPrefix.size()));
    if (it != queues_.end()) {
      if (!it->second.empty()) it->second.pop_front();
      if (it->second.empty()) queues_.erase(it);
    }
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
  write_records({Record{user_key(key), value}});
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
  write_records({Record{user_key(key), desired}});
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
  // An empty value counts as 0, as torch's FileStore reads it.
  if (auto it = kv_.find(key); it != kv_.end() && !it->second.empty()) {
    value = parse_counter(key, it->second);
  }
  C10D_CHECK_T(core::DistStoreError, !__builtin_add_overflow(value, delta, &value), describe(),
               ": add on key '", key, "' overflows int64 (", value, " + ", delta, ")");
  write_records({Record{user_key(key), to_bytes(std::to_string(value))}});
  return value;
}

bool FileStore::delete_key(const std::string& key) {
  check_owner();
  std::lock_guard<std::mutex> guard(mutex_);
  FileLock lock(*this, true);
  sync(true);
  if (kv_.count(key) == 0) return false;
  write_records({Record{str_cat(kDeleteMark, user_key(key)), {}}});
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
  // As torch counts: the handle counters are keys too ("refcount/" exists while this handle
  // is open); queues are not.
  return static_cast<int64_t>(kv_.size()) + 1 + (has_cleanup_ ? 1 : 0);
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
  // The whole new value, as torch writes it (its readers know no appends).
  Bytes joined;
  if (auto it = kv_.find(key); it != kv_.end()) joined = it->second;
  joined.insert(joined.end(), value.begin(), value.end());
  write_records({Record{user_key(key), std::move(joined)}});
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
  for (size_t i = 0; i < keys.size(); ++i) records.push_back(Record{user_key(keys[i]), values[i]});
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
  write_records({Record{str_cat(kPushPrefix, key), value}});
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
    write_records({Record{str_cat(kPopPrefix, key), {}}});
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
