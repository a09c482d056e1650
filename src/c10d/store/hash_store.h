// In-process store: a map guarded by one mutex. Thread-safe. Clones share the map.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "c10d/store/store.h"

namespace c10d::store {

class HashStore : public Store {
 public:
  explicit HashStore(Millis timeout = kDefaultStoreTimeout) : Store(timeout) {}

  void set(const std::string& key, const Bytes& value) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool delete_key(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t num_keys() override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;
  void append(const std::string& key, const Bytes& value) override;
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys) override;
  void multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override;
  bool has_extended_api() const override { return true; }
  void queue_push(const std::string& key, const Bytes& value) override;
  Bytes queue_pop(const std::string& key, bool block) override;
  int64_t queue_len(const std::string& key) override;
  std::vector<std::string> list_keys() override;
  std::string describe() const override { return "HashStore"; }
  // Another handle on the same map (with its own timeout), as torch's HashStore::clone.
  std::shared_ptr<Store> clone() override;

 private:
  struct State {
    std::mutex mutex;
    std::condition_variable changed;
    std::unordered_map<std::string, Bytes> map;
    std::unordered_map<std::string, std::deque<Bytes>> queues;
  };
  HashStore(std::shared_ptr<State> state, Millis timeout)
      : Store(timeout), state_(std::move(state)) {}

  // Both expect mutex_ held.
  bool present_locked(const std::string& key) const;
  void wait_locked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                   Millis timeout);

  std::shared_ptr<State> state_ = std::make_shared<State>();
  std::mutex& mutex_ = state_->mutex;
  std::condition_variable& changed_ = state_->changed;         // notified on every write; waiters
                                                               // re-check their keys
  std::unordered_map<std::string, Bytes>& map_ = state_->map;  // under mutex_
  std::unordered_map<std::string, std::deque<Bytes>>& queues_ = state_->queues;  // under mutex_
};

}  // namespace c10d::store
