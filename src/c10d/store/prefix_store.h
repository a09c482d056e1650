// A namespace inside another store: every key k becomes "<prefix>/k". Thread-safe if the
// underlying store is (all stores in c10d are).
#pragma once

#include "c10d/store/store.h"

namespace c10d::store {

class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> store);

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
  bool has_extended_api() const override { return store_->has_extended_api(); }
  void queue_push(const std::string& key, const Bytes& value) override;
  Bytes queue_pop(const std::string& key, bool block) override;
  int64_t queue_len(const std::string& key) override;
  std::vector<std::string> list_keys() override;
  std::shared_ptr<Store> clone() override;
  std::string describe() const override;
  // The timeout is the underlying store's, read and set through this one, as in torch: a
  // timeout set on either applies to both.
  Millis timeout() const override { return store_->timeout(); }
  void set_timeout(Millis timeout) override { store_->set_timeout(timeout); }

  const std::string& prefix() const { return prefix_; }
  const std::shared_ptr<Store>& underlying_store() const { return store_; }
  // The first store down the chain that is not a PrefixStore.
  std::shared_ptr<Store> underlying_non_prefix_store() const;

 private:
  std::string join(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> join(const std::vector<std::string>& keys) const;

  const std::string prefix_;
  const std::shared_ptr<Store> store_;
};

}  // namespace c10d::store
