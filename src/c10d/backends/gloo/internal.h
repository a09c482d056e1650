// What the files of the Gloo backend share and the public header keeps private: the timeout
// rules, Gloo's timeout wording, and what running an operation needs (GlooBackend::Shared).
#pragma once

#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "c10d/backends/gloo/gloo_backend.h"
#include "c10d/net/ring.h"

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

// What running an operation needs beyond its body, shared with the queue's worker so that a
// worker still in a Gloo call after shutdown() (which does not wait for it) never touches a
// destroyed backend: the contexts, the ring, and what error messages need.
struct GlooBackend::Shared {
  Shared(int rank, int size) : rank(rank), size(size) {}

  // "allreduce (sequence 3, rank 0 of 2)".
  std::string describe(const char* op, uint32_t tag) const;

  // The rank one of whose addresses appears in a Gloo error message, or -1.
  int peer_in_message(const std::string& message) const;

  // Turns a Gloo exception into ours, naming the operation, sequence number and peer.
  std::exception_ptr translate(std::exception_ptr error, const char* op_name,
                               const OpContext& op) const noexcept;

  // The context, tag and timeout of operation `tag`; `timeout` is resolved already.
  OpContext context_for(uint32_t tag, pg::Millis timeout) const;

  const int rank;
  const int size;
  // For every peer (none for this rank), the "[127.0.0.1]:41235" style addresses Gloo's error
  // messages may print for it, to name the rank. Gloo's TCP pairs each have their own socket,
  // so a peer's address differs per pair, and which one our pair prints depends on timing: the
  // far end of the connection, or, when our pair accepted the connection before Gloo's
  // rendezvous handed it the peer's advertised address, that address (Pair::connect overwrites
  // the far end with it). Both count. Written before the first operation.
  std::vector<std::vector<std::string>> peer_addresses;
  // One Gloo context per device; operations alternate between them by sequence number.
  std::vector<std::shared_ptr<::gloo::Context>> contexts;
  // The ring (null without one). Operations run one at a time, so at most one uses it.
  std::unique_ptr<net::Ring> ring;
};

}  // namespace c10d::backends::gloo
