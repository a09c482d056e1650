#include "c10d/store/prefix_store.h"

#include "c10d/core/exception.h"

namespace c10d::store {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> store)
    : prefix_(std::move(prefix)), store_(std::move(store)) {
  C10D_CHECK_ARG(store_ != nullptr, "PrefixStore: the underlying store is None");
}

std::vector<std::string> PrefixStore::join(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& key : keys) out.push_back(join(key));
  return out;
}

void PrefixStore::set(const std::string& key, const Bytes& value) { store_->set(join(key), value); }
Bytes PrefixStore::compare_set(const std::string& key, const Bytes& expected,
                               const Bytes& desired) {
  return store_->compare_set(join(key), expected, desired);
}
Bytes PrefixStore::get(const std::string& key) { return store_->get(join(key)); }
int64_t PrefixStore::add(const std::string& key, int64_t delta) {
  return store_->add(join(key), delta);
}
bool PrefixStore::delete_key(const std::string& key) { return store_->delete_key(join(key)); }
bool PrefixStore::check(const std::vector<std::string>& keys) { return store_->check(join(keys)); }
int64_t PrefixStore::num_keys() { return store_->num_keys(); }
void PrefixStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  store_->wait(join(keys), timeout);
}
void PrefixStore::append(const std::string& key, const Bytes& value) {
  store_->append(join(key), value);
}
std::vector<Bytes> PrefixStore::multi_get(const std::vector<std::string>& keys) {
  return store_->multi_get(join(keys));
}
void PrefixStore::multi_set(const std::vector<std::string>& keys,
                            const std::vector<Bytes>& values) {
  store_->multi_set(join(keys), values);
}
void PrefixStore::queue_push(const std::string& key, const Bytes& value) {
  store_->queue_push(join(key), value);
}
Bytes PrefixStore::queue_pop(const std::string& key, bool block) {
  return store_->queue_pop(join(key), block);
}
int64_t PrefixStore::queue_len(const std::string& key) { return store_->queue_len(join(key)); }

std::vector<std::string> PrefixStore::list_keys() {
  // Only the keys inside this prefix, with the prefix taken off.
  std::vector<std::string> out;
  const std::string head = prefix_ + "/";
  for (auto& key : store_->list_keys()) {
    std::string_view view(key);
    if (view.starts_with("/")) view.remove_prefix(1);  // a TCPStore client's own prefix
    if (view.starts_with(head)) out.emplace_back(view.substr(head.size()));
  }
  return out;
}

std::shared_ptr<Store> PrefixStore::clone() {
  return std::make_shared<PrefixStore>(prefix_, store_->clone());
}

std::string PrefixStore::describe() const {
  return "PrefixStore('" + prefix_ + "', " + store_->describe() + ")";
}

std::shared_ptr<Store> PrefixStore::underlying_non_prefix_store() const {
  std::shared_ptr<Store> store = store_;
  while (auto* prefix = dynamic_cast<PrefixStore*>(store.get())) store = prefix->store_;
  return store;
}

}  // namespace c10d::store
