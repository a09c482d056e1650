// ControlCollectives over any c10d Store.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "c10d/control/control_collectives.h"
#include "c10d/store/store.h"

namespace c10d::control {

// Runs every control collective through store keys derived from the operation's key
// ("<key>/<rank>", "<key>/count", ...). Keys are never deleted, so a key cannot be reused: a
// second operation with the same key on the same rank throws core::InvalidArgument (another
// rank's stale values would otherwise be read as this operation's). Thread-safe: distinct
// keys may be used from several threads at once.
class StoreCollectives : public ControlCollectives {
 public:
  StoreCollectives(std::shared_ptr<store::Store> store, int rank, int world_size);

  void barrier(const std::string& key, Millis timeout = kDefaultControlTimeout,
               bool block = true) override;
  int64_t all_sum(const std::string& key, int64_t value,
                  Millis timeout = kDefaultControlTimeout) override;
  void broadcast_send(const std::string& key, const Bytes& data,
                      Millis timeout = kDefaultControlTimeout) override;
  Bytes broadcast_recv(const std::string& key, Millis timeout = kDefaultControlTimeout) override;
  void gather_send(const std::string& key, const Bytes& data,
                   Millis timeout = kDefaultControlTimeout) override;
  std::vector<Bytes> gather_recv(const std::string& key, const Bytes& data,
                                 Millis timeout = kDefaultControlTimeout) override;
  Bytes scatter_send(const std::string& key, const std::vector<Bytes>& data,
                     Millis timeout = kDefaultControlTimeout) override;
  Bytes scatter_recv(const std::string& key, Millis timeout = kDefaultControlTimeout) override;
  std::vector<Bytes> all_gather(const std::string& key, const Bytes& data,
                                Millis timeout = kDefaultControlTimeout) override;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  const std::shared_ptr<store::Store>& store() const { return store_; }

 private:
  // Records `key` as used by `op`; throws InvalidArgument when it was used before.
  void claim_key(const std::string& key, const char* op);
  std::string rank_key(const std::string& key, int rank) const;
  // Adds this rank to the arrival count of `key`; the last rank to arrive sets "<key>/done".
  void arrive(const std::string& key);
  // Waits for "<key>/done"; on timeout names the ranks whose "<key>/<rank>" is missing.
  void wait_all_arrived(const char* op, const std::string& key, Millis timeout);
  // Waits until every rank in `ranks` has set "<key>/<rank>"; on timeout throws
  // DistStoreTimeoutError naming the ranks still missing.
  void wait_ranks(const char* op, const std::string& key, const std::vector<int>& ranks,
                  Millis timeout);
  // Waits for one key written by an unknown sender; `who` describes it in the error.
  void wait_sender(const char* op, const std::string& key, const std::string& store_key,
                   const char* who, Millis timeout);
  [[noreturn]] void throw_timeout(const char* op, const std::string& key, Millis timeout,
                                  const std::string& what) const;

  const std::shared_ptr<store::Store> store_;
  const int rank_;
  const int world_size_;
  std::mutex mutex_;
  std::unordered_set<std::string> used_keys_;  // guarded by mutex_
};

}  // namespace c10d::control
