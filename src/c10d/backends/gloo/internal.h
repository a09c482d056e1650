// What the files of the Gloo backend share and the public header keeps private: the timeout
// rules, Gloo's timeout wording, and the operation queue's state (GlooBackend::Shared).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "c10d/backends/gloo/gloo_backend.h"
#include "c10d/backends/ring/ring.h"

namespace c10d::backends::gloo {

namespace detail {

// Gloo reads a zero timeout as "use the default" in some places and rejects it in others, so
// "no timeout" becomes 30 days (longer would overflow nanosecond deadlines inside Gloo).
inline constexpr pg::Millis kForever = std::chrono::hours(24 * 30);

inline pg::Millis resolve_timeout(pg::Millis timeout) {
  return timeout <= pg::Millis::zero() ? kForever : timeout;
}

// Whether a Gloo error message says the operation timed out.
bool is_gloo_timeout(const std::string& message);

}  // namespace detail

// The queue, sequence counter and what error messages need, shared with the workers (see
// gloo_backend.h); collectives.cc reads the queue too, for barrier.
struct GlooBackend::Shared {
  Shared(int rank, int size) : rank(rank), size(size) {}

  // "allreduce (sequence 3, rank 0 of 2)".
  std::string describe(const char* op, uint32_t tag) const;

  // The rank one of whose addresses appears in a Gloo error message, or -1.
  int peer_in_message(const std::string& message) const;

  // Turns a Gloo exception into ours, naming the operation, sequence number and peer.
  std::exception_ptr translate(std::exception_ptr error, const char* op_name,
                               const OpContext& op) const noexcept;

  const int rank;
  const int size;
  // For every peer (none for this rank), the "[127.0.0.1]:41235" style addresses Gloo's error
  // messages may print for it, to name the rank. Gloo's TCP pairs each have their own socket,
  // so a peer's address differs per pair, and which one our pair prints depends on timing: the
  // far end of the connection, or, when our pair accepted the connection before Gloo's
  // rendezvous handed it the peer's advertised address, that address (Pair::connect overwrites
  // the far end with it). Both count. Written before the workers start.
  std::vector<std::vector<std::string>> peer_addresses;

  // One mutex orders both the sequence numbers and the queue, so the workers take operations
  // in sequence order on every rank.
  std::mutex mutex;
  std::condition_variable wake;    // work queued or stopping
  std::condition_variable exited;  // a worker finished a task or left worker_loop
  uint32_t next_seq = 0;           // guarded by mutex
  std::deque<Task> queue;          // guarded by mutex
  bool stopping = false;           // guarded by mutex
  int running_workers = 0;         // guarded by mutex
  // Works of the tasks the workers are running, so shutdown() can fail them.
  std::vector<std::shared_ptr<core::Work>> in_flight;  // guarded by mutex

  // The ring (null without one) and its turns: tickets are drawn with the sequence numbers,
  // and an operation runs on the ring once every earlier ticket has finished.
  std::unique_ptr<ring::Ring> ring;
  int64_t next_ring_ticket = 0;  // guarded by mutex
  // Written under mutex; read without it on the fast path (the turn is already ours).
  std::atomic<int64_t> ring_turn{0};
  std::atomic<uint32_t> ring_holder{0};  // sequence number of the last operation to take a turn
  std::set<int64_t> ring_done;  // guarded by mutex: tickets that gave up waiting, beyond the turn
  std::condition_variable ring_turn_changed;

  // Waits for the operation's turn on the ring: DistTimeoutError at its timeout,
  // DistBackendError once the backend stops.
  void wait_ring_turn(const char* op_name, const OpContext& op);
  // The operation holding `ticket` is done with the ring (or gave up waiting for it).
  void finish_ring_turn(int64_t ticket);
};

}  // namespace c10d::backends::gloo
