// StoreAdapter: lets Gloo's rendezvous (gloo::rendezvous::Context::connectFullMesh) run over a
// c10d store. Keys are namespaced with a prefix so that several Gloo contexts (one per device)
// can rendezvous through the same store. Thread-safe as far as the wrapped store is.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "c10d/store/store.h"

namespace c10d::backends::gloo {

class StoreAdapter : public ::gloo::rendezvous::Store {
 public:
  StoreAdapter(std::shared_ptr<store::Store> store, std::string prefix);

  void set(const std::string& key, const std::vector<char>& data) override;
  // Waits up to the wrapped store's timeout; a missing key throws the store's timeout error.
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  const store::Store& wrapped() const { return *store_; }

 private:
  std::string full_key(const std::string& key) const { return prefix_ + key; }

  std::shared_ptr<store::Store> store_;
  std::string prefix_;
};

}  // namespace c10d::backends::gloo
