// A Store kept in one shared file, for processes on one host (or on a shared file system
// with working flock) that have no network rendezvous.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "c10d/store/store.h"

namespace c10d::store {

// FileStore keeps every change as an append-only record in the file at `path`, in torch's
// format, so torch and c10d processes can share one file: a key's new value, a deletion, the
// handle counters, and c10d's queue pushes and pops. Each handle replays the records it has not
// seen yet into a private cache, so a call reads only what other handles wrote since its last
// call. Each call takes flock on the file (exclusive to write, shared to read; torch's handles
// take the same locks) and a per-handle mutex, so the store is thread-safe and any number of
// processes can share it.
//
// Users, as torch counts them: a handle adds one to "refcount/" when it opens and takes it away
// when it is destroyed; a handle built by the constructor (a "worker", not a clone()) also adds
// one to "cleanup/" then. With num_workers >= 0 the file is removed when no handle is left and
// num_workers workers have finished, so a worker that finishes before the others join does not
// wipe the data; without (num_workers < 0, the default) it is never removed. A process that
// dies without destroying its handle leaves its count behind; such a file is not removed
// automatically (use a fresh path per run, as with torch).
//
// Blocking calls (get, wait, multi_get, queue_pop with block) poll the file with a backoff
// from 1 ms to 16 ms and throw DistStoreTimeoutError naming the keys at the deadline.
class FileStore : public Store {
 public:
  // Opens (creating if needed) the store file. Throws DistStoreError naming the path and the
  // errno text when the file cannot be opened, locked or read, or when it is not a FileStore
  // file (it is then left as it is).
  explicit FileStore(std::string path, int num_workers = -1, Millis timeout = kDefaultStoreTimeout);
  // Records this user's leave and removes the file when it was the last one and num_workers
  // workers have left (see above).
  // Never throws; a failure is reported on stderr.
  ~FileStore() override;

  const std::string& path() const { return path_; }
  int num_workers() const { return num_workers_; }

  void set(const std::string& key, const Bytes& value) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool delete_key(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  // Live user keys and the handle counters, as torch counts; queues are not keys.
  int64_t num_keys() override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;

  void append(const std::string& key, const Bytes& value) override;
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys) override;
  void multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override;
  bool has_extended_api() const override { return true; }

  // Queues live in their own namespace: a queue named `key` does not make `key` exist for
  // get/check/wait, and an empty queue is the same as no queue.
  void queue_push(const std::string& key, const Bytes& value) override;
  Bytes queue_pop(const std::string& key, bool block) override;
  int64_t queue_len(const std::string& key) override;
  // Live user keys, sorted.
  std::vector<std::string> list_keys() override;
  // A new FileStore on the same path, with its own descriptor, lock and cache; it counts as
  // another user of the file (but not as a worker).
  std::shared_ptr<Store> clone() override;

  std::string describe() const override { return "FileStore(" + path_ + ")"; }

 private:
  enum class Role : uint8_t { kWorker, kClone };
  struct Record;
  static Record counter_record(std::string_view key, int64_t value);
  class FileLock;

  FileStore(std::string path, int num_workers, Millis timeout, Role role);

  // Opens the path and joins it as `role_`; retries when the file it opened was removed by
  // its last user before the lock was taken.
  void open_and_join();
  // Reads every complete record after pos_ into the cache. Expects mutex_ and the file lock
  // held; with `exclusive`, also cuts off a torn record left by a writer that died mid-write.
  void sync(bool exclusive);
  // Appends `records` in one write at pos_ and applies them to the cache. Expects mutex_ and
  // the exclusive file lock held, and the cache synced.
  void write_records(const std::vector<Record>& records);
  void apply(const Record& record);
  // True when the file grew or shrank since the last sync (cheap fstat, no lock). When false,
  // the cache already holds everything in the file, including writes made through this handle
  // by other threads, so pollers read the cache instead of locking the file.
  bool changed_since_sync();
  // Syncs under the shared lock when `force` or when the file changed. Expects mutex_ held.
  void refresh(bool force);
  bool all_present(const std::vector<std::string>& keys) const;

  // A handle belongs to the process that opened it: after fork() the child shares the
  // parent's descriptor (and thus its flock), so using it there would race the parent.
  void check_owner() const;
  [[noreturn]] void throw_errno(const char* what, int err) const;

  const std::string path_;
  const int num_workers_;
  const Role role_;
  const pid_t owner_pid_;

  std::mutex mutex_;  // guards everything below; taken before the file lock
  int fd_ = -1;
  off_t pos_ = 0;          // end of the last complete record applied
  off_t synced_size_ = 0;  // file size seen by the last sync
  std::unordered_map<std::string, Bytes> kv_;
  std::unordered_map<std::string, std::deque<Bytes>> queues_;
  int64_t refcount_ = 0;  // handles open on the file
  int64_t cleanup_ = 0;   // workers that closed theirs
  bool has_cleanup_ = false;
};

}  // namespace c10d::store
