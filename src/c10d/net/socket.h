// Small RAII helpers over blocking-style TCP client sockets, used by the TCPStore client and
// the ring (net/ring.h).
// Every operation takes a core::Deadline, implemented with non-blocking sockets and poll(), so
// a dead or silent peer can never hang the caller past its deadline.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "c10d/core/deadline.h"

namespace c10d::net {

// The text of errno value `err`.
std::string errno_text(int err);

// Waits for `events` on `fd` until `deadline`: 1 when ready, 0 when the deadline passed first,
// or -errno.
int wait_for(int fd, short events, const core::Deadline& deadline);

// Outcome of an operation whose failure is ordinary (a refused connect while the server is
// still starting). `error` is an errno value (0 = success), `message` the text for a person.
struct [[nodiscard]] Status {
  int error = 0;
  std::string message;
  bool ok() const { return error == 0; }
  static Status success() { return {}; }
};

// An owned, connected TCP socket with a small read buffer. Not thread-safe: one user at a
// time (TCPStore guards its socket with a mutex).
class Socket {
 public:
  Socket() = default;
  ~Socket() { close(); }
  Socket(Socket&& other) noexcept { *this = std::move(other); }
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  // One connect attempt to host:port (a name, IPv4 or IPv6 literal; every resolved address is
  // tried in turn) that gives up at `deadline`. On success `out` holds a socket with
  // TCP_NODELAY set. The status message names host:port and the errno text.
  static Status connect(const std::string& host, uint16_t port, const core::Deadline& deadline,
                        Socket& out);

  bool valid() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  void close();

  // `peer` names the other side in error messages ("the store server at 127.0.0.1:29500").
  void set_peer_name(std::string peer) { peer_ = std::move(peer); }
  const std::string& peer_name() const { return peer_; }

  // Sends all bytes. Throws DistNetworkError when the peer is gone or the socket fails, and
  // DistTimeoutError when the deadline passes first.
  void send_all(const void* data, size_t size, const core::Deadline& deadline);
  // Receives exactly `size` bytes, with the same errors; a peer that closes the connection
  // gives DistNetworkError "<peer> closed the connection".
  void recv_exact(void* data, size_t size, const core::Deadline& deadline);
  // Waits until at least one byte can be read (or the peer closed). False when the deadline
  // passed first. Does not consume anything.
  bool wait_readable(const core::Deadline& deadline);

 private:
  explicit Socket(int fd) : fd_(fd) {}
  static constexpr size_t kReadChunk = 64 * 1024;
  // Reads whatever is available (after waiting for it) into the buffer.
  void fill(const core::Deadline& deadline);

  int fd_ = -1;
  std::string peer_;
  std::unique_ptr<char[]> rbuf_;  // kReadChunk bytes, allocated on first read
  size_t rpos_ = 0;               // unconsumed received bytes are [rpos_, rend_)
  size_t rend_ = 0;
};

}  // namespace c10d::net
