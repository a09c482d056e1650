#include "c10d/control/store_collectives.h"

#include <utility>

#include "c10d/core/exception.h"

namespace c10d::control {
namespace {

using core::detail::str_cat;

// At most this many ranks are spelled out in a timeout message; the rest are counted.
constexpr size_t kMaxRanksListed = 32;

std::string format_ranks(const std::vector<int>& ranks) {
  std::string out = "[";
  for (size_t i = 0; i < ranks.size() && i < kMaxRanksListed; ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(ranks[i]);
  }
  if (ranks.size() > kMaxRanksListed) {
    out += str_cat(", ... (", ranks.size() - kMaxRanksListed, " more)");
  }
  return out + "]";
}

}  // namespace

StoreCollectives::StoreCollectives(std::shared_ptr<store::Store> store, int rank, int world_size)
    : store_(std::move(store)), rank_(rank), world_size_(world_size) {
  C10D_CHECK_ARG(store_ != nullptr, "StoreCollectives: store must not be None");
  C10D_CHECK_ARG(world_size_ > 0, "StoreCollectives: world_size must be positive, got ",
                 world_size_);
  C10D_CHECK_ARG(rank_ >= 0 && rank_ < world_size_, "StoreCollectives: rank ", rank_,
                 " is outside [0, ", world_size_, ")");
}

void StoreCollectives::claim_key(const std::string& key, const char* op) {
  std::lock_guard<std::mutex> lock(mutex_);
  C10D_CHECK_ARG(used_keys_.insert(key).second, "StoreCollectives.", op, ": key '", key,
                 "' was already used by an earlier operation on rank ", rank_,
                 "; every control collective needs a key of its own");
}

std::string StoreCollectives::rank_key(const std::string& key, int rank) const {
  return str_cat(key, "/", rank);
}

void StoreCollectives::throw_timeout(const char* op, const std::string& key, Millis timeout,
                                     const std::string& what) const {
  throw core::DistStoreTimeoutError(str_cat(
      "StoreCollectives.", op, "(key='", key, "') on rank ", rank_, " of ", world_size_,
      " timed out after ", core::format_timeout(timeout), " on ", store_->describe(), ": ", what));
}

void StoreCollectives::wait_ranks(const char* op, const std::string& key,
                                  const std::vector<int>& ranks, Millis timeout) {
  if (ranks.empty()) return;
  std::vector<std::string> keys;
  keys.reserve(ranks.size());
  for (int r : ranks) keys.push_back(rank_key(key, r));
  try {
    store_->wait(keys, timeout);
  } catch (const core::DistStoreTimeoutError&) {
    std::vector<int> missing;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!store_->check({keys[i]})) missing.push_back(ranks[i]);
    }
    throw_timeout(op, key, timeout, str_cat("rank(s) ", format_ranks(missing), " did not arrive"));
  }
}

void StoreCollectives::wait_sender(const char* op, const std::string& key,
                                   const std::string& store_key, const char* who, Millis timeout) {
  try {
    store_->wait({store_key}, timeout);
  } catch (const core::DistStoreTimeoutError&) {
    throw_timeout(op, key, timeout, str_cat(who, " (store key '", store_key, "' is missing)"));
  }
}

void StoreCollectives::arrive(const std::string& key) {
  // The per-rank key exists only so a timeout can say who is missing.
  store_->set(rank_key(key, rank_), store::to_bytes("1"));
  if (store_->add(key + "/count", 1) == world_size_) {
    store_->set(key + "/done", store::to_bytes("1"));
  }
}

void StoreCollectives::wait_all_arrived(const char* op, const std::string& key, Millis timeout) {
  try {
    store_->wait({key + "/done"}, timeout);
  } catch (const core::DistStoreTimeoutError&) {
    std::vector<int> missing;
    for (int r = 0; r < world_size_; ++r) {
      if (!store_->check({rank_key(key, r)})) missing.push_back(r);
    }
    throw_timeout(op, key, timeout, str_cat("rank(s) ", format_ranks(missing), " did not arrive"));
  }
}

void StoreCollectives::barrier(const std::string& key, Millis timeout, bool block) {
  claim_key(key, "barrier");
  arrive(key);
  if (block) wait_all_arrived("barrier", key, timeout);
}

int64_t StoreCollectives::all_sum(const std::string& key, int64_t value, Millis timeout) {
  claim_key(key, "all_sum");
  // The value is added before arriving, so once "<key>/done" exists the sum is complete.
  store_->add(key + "/sum", value);
  arrive(key);
  wait_all_arrived("all_sum", key, timeout);
  return store_->add(key + "/sum", 0);
}

void StoreCollectives::broadcast_send(const std::string& key, const Bytes& data, Millis) {
  claim_key(key, "broadcast_send");
  store_->set(key + "/data", data);
}

Bytes StoreCollectives::broadcast_recv(const std::string& key, Millis timeout) {
  claim_key(key, "broadcast_recv");
  std::string store_key = key + "/data";
  wait_sender("broadcast_recv", key, store_key, "no rank called broadcast_send", timeout);
  return store_->get(store_key);
}

void StoreCollectives::gather_send(const std::string& key, const Bytes& data, Millis) {
  claim_key(key, "gather_send");
  store_->set(rank_key(key, rank_), data);
}

std::vector<Bytes> StoreCollectives::gather_recv(const std::string& key, const Bytes& data,
                                                 Millis timeout) {
  claim_key(key, "gather_recv");
  std::vector<int> others;
  std::vector<std::string> keys;
  for (int r = 0; r < world_size_; ++r) {
    if (r == rank_) continue;
    others.push_back(r);
    keys.push_back(rank_key(key, r));
  }
  wait_ranks("gather_recv", key, others, timeout);
  std::vector<Bytes> received = keys.empty() ? std::vector<Bytes>{} : store_->multi_get(keys);
  std::vector<Bytes> out;
  out.reserve(world_size_);
  for (int r = 0, i = 0; r < world_size_; ++r) {
    out.push_back(r == rank_ ? data : std::move(received[i++]));
  }
  return out;
}

Bytes StoreCollectives::scatter_send(const std::string& key, const std::vector<Bytes>& data,
                                     Millis) {
  claim_key(key, "scatter_send");
  C10D_CHECK_ARG(data.size() == static_cast<size_t>(world_size_), "StoreCollectives.",
                 "scatter_send(key='", key, "'): expected one entry per rank (", world_size_,
                 "), got ", data.size());
  std::vector<std::string> keys;
  std::vector<Bytes> values;
  for (int r = 0; r < world_size_; ++r) {
    if (r == rank_) continue;
    keys.push_back(rank_key(key, r));
    values.push_back(data[r]);
  }
  if (!keys.empty()) store_->multi_set(keys, values);
  return data[rank_];
}

Bytes StoreCollectives::scatter_recv(const std::string& key, Millis timeout) {
  claim_key(key, "scatter_recv");
  std::string store_key = rank_key(key, rank_);
  wait_sender("scatter_recv", key, store_key, "no rank called scatter_send", timeout);
  return store_->get(store_key);
}

std::vector<Bytes> StoreCollectives::all_gather(const std::string& key, const Bytes& data,
                                                Millis timeout) {
  claim_key(key, "all_gather");
  store_->set(rank_key(key, rank_), data);
  std::vector<int> ranks;
  std::vector<std::string> keys;
  for (int r = 0; r < world_size_; ++r) {
    ranks.push_back(r);
    keys.push_back(rank_key(key, r));
  }
  wait_ranks("all_gather", key, ranks, timeout);
  return store_->multi_get(keys);
}

}  // namespace c10d::control
