// The key-value store every rendezvous and control path is built on.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "c10d/core/deadline.h"

namespace c10d::store {

using Bytes = std::vector<uint8_t>;
using core::Millis;

// Default timeout of every store, as in torch.distributed.
inline constexpr Millis kDefaultStoreTimeout = std::chrono::minutes(5);

inline Bytes to_bytes(std::string_view s) { return Bytes(s.begin(), s.end()); }
inline std::string to_string(const Bytes& b) { return std::string(b.begin(), b.end()); }

// Abstract store. Every implementation is thread-safe: any number of threads may call any
// method concurrently. Blocking calls (get, wait, multi_get, queue_pop with block) honour the
// store's timeout (or the one passed) and throw core::DistStoreTimeoutError naming the keys.
class Store {
 public:
  explicit Store(Millis timeout = kDefaultStoreTimeout) : timeout_ms_(timeout.count()) {}
  virtual ~Store() = default;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Stores `value` under `key`, replacing any previous value, and wakes waiters on `key`.
  virtual void set(const std::string& key, const Bytes& value) = 0;
  // Atomically: a missing key with empty `expected` is created with `desired`; a missing key
  // otherwise stays missing and `expected` is returned; an existing key is replaced only when
  // its value equals `expected`. Returns the value stored afterwards.
  virtual Bytes compare_set(const std::string& key, const Bytes& expected,
                            const Bytes& desired) = 0;
  // Waits (up to the store timeout) for `key` and returns its value.
  virtual Bytes get(const std::string& key) = 0;
  // Adds `delta` to the integer counter under `key` (created at 0) and returns the new value.
  // The counter is stored as decimal text; a non-numeric existing value is an error.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Removes `key`; true when it existed.
  virtual bool delete_key(const std::string& key) = 0;
  // True when every key exists, without waiting.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Number of keys held (implementations may count their own bookkeeping keys).
  virtual int64_t num_keys() = 0;
  // Blocks until every key exists or the timeout passes.
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }
  virtual void wait(const std::vector<std::string>& keys, Millis timeout) = 0;

  // Extended API. The defaults are correct but not atomic across keys; stores override them.
  virtual void append(const std::string& key, const Bytes& value);
  virtual std::vector<Bytes> multi_get(const std::vector<std::string>& keys);
  virtual void multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values);
  virtual bool has_extended_api() const { return false; }

  // Optional features; the defaults throw core::NotSupported naming the store and the call.
  virtual void queue_push(const std::string& key, const Bytes& value);
  // Pops the oldest value; with block, waits up to the timeout, else throws
  // DistQueueEmptyError when empty.
  virtual Bytes queue_pop(const std::string& key, bool block);
  virtual int64_t queue_len(const std::string& key);
  virtual std::vector<std::string> list_keys();
  // A new, independent handle on the same data (a new connection for network stores).
  virtual std::shared_ptr<Store> clone();

  // Name used in messages ("TCPStore(127.0.0.1:29500)", "HashStore").
  virtual std::string describe() const = 0;

  virtual Millis timeout() const { return Millis(timeout_ms_.load(std::memory_order_relaxed)); }
  virtual void set_timeout(Millis timeout) {
    timeout_ms_.store(timeout.count(), std::memory_order_relaxed);
  }

 protected:
  [[noreturn]] void throw_not_supported(const char* op) const;

 private:
  std::atomic<int64_t> timeout_ms_;
};

// Throws the one timeout error every store uses for wait/get, naming keys, store and timeout.
// The deadline of a wait for keys (get, wait, multi_get, queue_pop): zero waits without one,
// as everywhere, but a negative timeout (`deadline - now` computed too late) has run out
// already, as in torch: the keys are looked for once instead of waited for forever.
core::Deadline key_deadline(Millis timeout);

[[noreturn]] void throw_wait_timeout(const std::string& store, const std::vector<std::string>& keys,
                                     Millis timeout);

// Parses the decimal counter text that add() stores; throws InvalidArgument (ValueError in
// Python, as in torch) naming the key.
int64_t parse_counter(const std::string& key, const Bytes& value);

}  // namespace c10d::store
