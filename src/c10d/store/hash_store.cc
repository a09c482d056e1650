#include "c10d/store/hash_store.h"

#include "c10d/core/exception.h"

namespace c10d::store {

bool HashStore::present_locked(const std::string& key) const {
  if (map_.count(key) != 0) return true;
  auto it = queues_.find(key);
  return it != queues_.end() && !it->second.empty();
}

void HashStore::wait_locked(std::unique_lock<std::mutex>& lock,
                            const std::vector<std::string>& keys, Millis timeout) {
  auto ready = [&] {
    for (const auto& key : keys) {
      if (!present_locked(key)) return false;
    }
    return true;
  };
  const core::Deadline deadline = key_deadline(timeout);
  if (deadline.infinite()) {
    changed_.wait(lock, ready);
  } else if (!changed_.wait_until(lock, deadline.time_point(), ready)) {
    throw_wait_timeout(describe(), keys, timeout);
  }
}

void HashStore::set(const std::string& key, const Bytes& value) {
  {
    std::lock_guard lock(mutex_);
    map_[key] = value;
  }
  changed_.notify_all();
}

Bytes HashStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  std::unique_lock lock(mutex_);
  auto it = map_.find(key);
  if (it == map_.end()) {
    if (!expected.empty()) return expected;
    map_.emplace(key, desired);
  } else if (it->second == expected) {
    it->second = desired;
  } else {
    return it->second;
  }
  lock.unlock();
  changed_.notify_all();
  return desired;
}

Bytes HashStore::get(const std::string& key) {
  std::unique_lock lock(mutex_);
  wait_locked(lock, {key}, timeout());
  auto it = map_.find(key);
  if (it == map_.end()) {
    throw core::DistStoreError("HashStore: key '" + key + "' holds a queue, not a value");
  }
  return it->second;
}

int64_t HashStore::add(const std::string& key, int64_t delta) {
  int64_t value = delta;
  {
    std::lock_guard lock(mutex_);
    auto it = map_.find(key);
    if (it != map_.end()) value += parse_counter(key, it->second);
    map_[key] = to_bytes(std::to_string(value));
  }
  changed_.notify_all();
  return value;
}

bool HashStore::delete_key(const std::string& key) {
  std::lock_guard lock(mutex_);
  return map_.erase(key) + queues_.erase(key) > 0;
}

bool HashStore::check(const std::vector<std::string>& keys) {
  std::lock_guard lock(mutex_);
  for (const auto& key : keys) {
    if (!present_locked(key)) return false;
  }
  return true;
}

int64_t HashStore::num_keys() {
  std::lock_guard lock(mutex_);
  return static_cast<int64_t>(map_.size());
}

void HashStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  std::unique_lock lock(mutex_);
  wait_locked(lock, keys, timeout);
}

void HashStore::append(const std::string& key, const Bytes& value) {
  {
    std::lock_guard lock(mutex_);
    auto& stored = map_[key];
    stored.insert(stored.end(), value.begin(), value.end());
  }
  changed_.notify_all();
}

std::vector<Bytes> HashStore::multi_get(const std::vector<std::string>& keys) {
  std::unique_lock lock(mutex_);
  wait_locked(lock, keys, timeout());
  std::vector<Bytes> values;
  values.reserve(keys.size());
  for (const auto& key : keys) values.push_back(map_.at(key));
  return values;
}

void HashStore::multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  C10D_CHECK_ARG_EQ(keys.size(), values.size(), "multi_set: keys and values differ in length");
  {
    std::lock_guard lock(mutex_);
    for (size_t i = 0; i < keys.size(); ++i) map_[keys[i]] = values[i];
  }
  changed_.notify_all();
}

void HashStore::queue_push(const std::string& key, const Bytes& value) {
  {
    std::lock_guard lock(mutex_);
    queues_[key].push_back(value);
  }
  changed_.notify_all();
}

Bytes HashStore::queue_pop(const std::string& key, bool block) {
  std::unique_lock lock(mutex_);
  if (block) {
    wait_locked(lock, {key}, timeout());
  }
  auto it = queues_.find(key);
  if (it == queues_.end() || it->second.empty()) {
    throw core::DistQueueEmptyError("HashStore: queue '" + key + "' is empty");
  }
  Bytes value = std::move(it->second.front());
  it->second.pop_front();
  return value;
}

int64_t HashStore::queue_len(const std::string& key) {
  std::lock_guard lock(mutex_);
  auto it = queues_.find(key);
  return it == queues_.end() ? 0 : static_cast<int64_t>(it->second.size());
}

std::vector<std::string> HashStore::list_keys() {
  std::lock_guard lock(mutex_);
  std::vector<std::string> keys;
  keys.reserve(map_.size());
  for (const auto& [key, value] : map_) keys.push_back(key);
  return keys;
}

std::shared_ptr<Store> HashStore::clone() {
  return std::shared_ptr<Store>(new HashStore(state_, timeout()));
}

}  // namespace c10d::store
