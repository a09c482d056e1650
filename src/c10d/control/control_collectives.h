// Collectives for control messages (small byte strings between the ranks of a job), as
// opposed to the data collectives of a ProcessGroup. Used to coordinate setup and debugging.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "c10d/core/deadline.h"
#include "c10d/store/store.h"

namespace c10d::control {

using core::Millis;
using store::Bytes;

inline constexpr Millis kDefaultControlTimeout = std::chrono::minutes(5);

// Every operation is identified by a key that all participating ranks pass and that no rank
// uses twice. Each call blocks for at most `timeout` (zero or less: no deadline) and throws
// core::DistStoreTimeoutError naming the operation, the key and the ranks that did not take
// part in time. Implementations say whether they are thread-safe.
class ControlCollectives {
 public:
  virtual ~ControlCollectives() = default;

  // Every rank calls it. With block, returns once all ranks arrived; without, only announces
  // this rank's arrival.
  virtual void barrier(const std::string& key, Millis timeout = kDefaultControlTimeout,
                       bool block = true) = 0;
  // Every rank calls it; each gets the sum of all ranks' values.
  virtual int64_t all_sum(const std::string& key, int64_t value,
                          Millis timeout = kDefaultControlTimeout) = 0;
  // One rank sends, every other rank receives the same bytes.
  virtual void broadcast_send(const std::string& key, const Bytes& data,
                              Millis timeout = kDefaultControlTimeout) = 0;
  virtual Bytes broadcast_recv(const std::string& key, Millis timeout = kDefaultControlTimeout) = 0;
  // Every rank but one sends; the receiver gets all ranks' data in rank order, its own
  // (`data`) included.
  virtual void gather_send(const std::string& key, const Bytes& data,
                           Millis timeout = kDefaultControlTimeout) = 0;
  virtual std::vector<Bytes> gather_recv(const std::string& key, const Bytes& data,
                                         Millis timeout = kDefaultControlTimeout) = 0;
  // One rank sends data[r] to every rank r (one entry per rank) and returns its own entry;
  // the others receive theirs.
  virtual Bytes scatter_send(const std::string& key, const std::vector<Bytes>& data,
                             Millis timeout = kDefaultControlTimeout) = 0;
  virtual Bytes scatter_recv(const std::string& key, Millis timeout = kDefaultControlTimeout) = 0;
  // Every rank sends; each gets all ranks' data in rank order.
  virtual std::vector<Bytes> all_gather(const std::string& key, const Bytes& data,
                                        Millis timeout = kDefaultControlTimeout) = 0;
};

}  // namespace c10d::control
