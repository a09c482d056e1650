// A ring of TCP connections that all_reduce runs on, driven by the thread that runs the
// operation: the Gloo backend's all_reduce over its group, and the hierarchical backend's
// between hosts (one member per host). Gloo's transport hands every message to an event-loop
// thread that polls for it; with a few ranks per core those hand-offs and polls cost more than
// the transfer (see docs/design/gloo.md). For the backends.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "c10d/core/deadline.h"
#include "c10d/core/dtype.h"
#include "c10d/core/reduce_op.h"
#include "c10d/net/socket.h"
#include "c10d/pg/options.h"
#include "c10d/pg/signature.h"
#include "c10d/store/store.h"

namespace c10d::net {

// The [offset, offset + count) piece `part` of `parts` nearly equal pieces of `n` elements.
std::pair<int64_t, int64_t> part_of(int64_t n, int parts, int part);

class Ring {
 public:
  // Member `index` of a ring whose members are ranks `ranks` (by index). Listens on
  // `listen_ip` (the address the Gloo group of the same ranks chose: GLOO_SOCKET_IFNAME's, or
  // the one routing towards the store), publishes it through `store` (prefixed for this ring),
  // connects to the next member and accepts the previous one. Throws DistNetworkError naming
  // the member it could not reach, DistTimeoutError after `timeout`. Messages read
  // "<label.before> allreduce (sequence 3, ...)<label.after>: ...".
  struct Label {
    std::string before;  // "hier"
    std::string after;   // " between hosts"
  };
  // A member whose ring breaks reports why under "failed/<member>" in `store`, so that a
  // member that sees it close its connection can tell a peer that failed (and what it lost)
  // from a peer that died without a word.
  Ring(std::shared_ptr<store::Store> store, int index, std::vector<int> ranks,
       const std::string& listen_ip, pg::Millis timeout, Label label);
  ~Ring();
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  // Reduces `count` elements at `data` with every member's (op must group freely: SUM, MIN,
  // ...), a ring reduce-scatter and all-gather, so every member ends with the same bits.
  // `call` is the user's collective this runs for (its sequence number is the same on every
  // member): the previous member's must be the same, else every member fails naming both.
  // Errors name it, the member waited for, its rank and address: DistTimeoutError, else
  // DistBackendError; after one the ring refuses further operations (its streams are out of
  // step).
  void allreduce(void* data, size_t count, core::DType dtype, const core::ReduceOp& op,
                 pg::Millis timeout, const pg::Signature& call);
  // Member m's `block_bytes` at data + m * block_bytes reach every member (the ring's
  // all-gather half). Same checks and errors as allreduce.
  void allgather(void* data, size_t block_bytes, pg::Millis timeout, const pg::Signature& call);
  // Member `root`'s `bytes` at `data` reach every member, passed on along the ring piece by
  // piece as they arrive; the last member's answer ends the root's part. Same checks (the
  // root too) and errors as allreduce.
  void broadcast(void* data, size_t bytes, int root, pg::Millis timeout, const pg::Signature& call);
  // The address member `index` listens on, without the port.
  std::string host_of(int index) const { return hosts_[index]; }
  // Fails a running operation within a poll interval and every later one (backend shutdown).
  void abort();
  // Only the header: the previous member runs `call` too (for a collective whose data takes
  // another way; with two members that is every member's verdict).
  void check(pg::Millis timeout, const pg::Signature& call);
  // The caller's operation failed outside the ring (another step of it): the ring refuses
  // further operations and closes its streams, so the other members fail at once instead of
  // waiting for this one until their timeout. Only from the thread that runs operations.
  void break_off(const std::string& why);

 private:
  struct Peer {
    int fd = -1;
    int index = -1;
  };
  // The constructor's work: listen, publish, connect to the next member, accept the previous.
  void connect_ring(const std::string& listen_ip, const core::Deadline& deadline);
  // Closes the listener and the previous member's connection (next_ closes itself).
  void close_fds();
  // Sends `out_bytes` from `out` to the next member while receiving `in_bytes` into `in` from
  // the previous one; `received(n)` is called as the first n bytes of `in` have arrived. With
  // `relay`, only bytes already received are sent (out == in: passing a message on).
  template <typename OnReceived>
  void exchange(const char* out, size_t out_bytes, char* in, size_t in_bytes,
                const core::Deadline& deadline, OnReceived received, bool relay = false);
  // Records the operation for messages, refuses it on a broken ring, and checks that the
  // previous member runs the same one (the user's call, and the ring's step: kind, bytes,
  // root). Returns its deadline.
  core::Deadline begin(uint32_t kind, const pg::Signature& call, size_t bytes, int root,
                       pg::Millis timeout);
  // The all-gather half: every member's chunk chunk(m) (offset, bytes) reaches every member.
  template <typename Chunk>
  void gather_around(char* bytes, Chunk chunk, int shift, const core::Deadline& deadline);
  // "allreduce (sequence 3, rank 0, 1048576 bytes)", or "connect (rank 0)" in the constructor
  std::string describe_op() const;
  // "rank 2 on host 10.0.0.2 (ring member 1, port 41234)"
  std::string describe(int index) const;
  [[noreturn]] void fail(const std::string& what, bool timeout);
  // Records the first failure, reports it in the store and closes the streams (the
  // neighbours learn at once).
  void mark_broken(const std::string& message, bool timeout);
  // Best effort: `message` under this member's "failed/" key, marked as a timeout or not.
  // Only the first report is written: what came after it (a shutdown once the operation
  // failed) is its consequence, and a slower neighbour must still read the cause.
  void report(const std::string& message, bool timeout) noexcept;
  // Why member `index` closed its connection, from its report (" after it failed: ..."), or,
  // without one within a second, that it ended without a word; and whether it timed out (a
  // failure passed on from a timeout is a timeout too).
  struct Closure {
    std::string why;
    bool timeout = false;
  };
  Closure closed_because(int index) const;

  const std::shared_ptr<store::Store> store_;
  const int index_;
  const int size_;
  const Label label_;
  const std::vector<int> ranks_;
  std::vector<std::string> hosts_;  // the address each member listens on, by member
  std::vector<int> ports_;
  int listen_fd_ = -1;
  net::Socket next_;        // to member index_ + 1
  Peer prev_;               // from member index_ - 1
  bool connecting_ = true;  // still in the constructor
  pg::Signature op_;        // the running operation, for messages (formatted only on error)
  size_t op_bytes_ = 0;
  pg::Millis timeout_{0};
  std::string broken_;  // why the ring refuses operations, once it does
  std::vector<char> incoming_;
  std::atomic<bool> aborted_{false};
  std::atomic<bool> reported_{false};
};

}  // namespace c10d::net
