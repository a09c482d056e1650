#include "c10d/backends/gloo/store_adapter.h"

#include <utility>

namespace c10d::backends::gloo {

StoreAdapter::StoreAdapter(std::shared_ptr<store::Store> store, std::string prefix)
    : store_(std::move(store)), prefix_(std::move(prefix)) {}

void StoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  store_->set(full_key(key), store::Bytes(data.begin(), data.end()));
}

std::vector<char> StoreAdapter::get(const std::string& key) {
  store::Bytes value = store_->get(full_key(key));
  return std::vector<char>(value.begin(), value.end());
}

void StoreAdapter::wait(const std::vector<std::string>& keys) { wait(keys, store_->timeout()); }

void StoreAdapter::wait(const std::vector<std::string>& keys,
                        const std::chrono::milliseconds& timeout) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const auto& key : keys) full.push_back(full_key(key));
  store_->wait(full, timeout);
}

}  // namespace c10d::backends::gloo
