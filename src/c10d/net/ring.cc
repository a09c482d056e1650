#include "c10d/net/ring.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "c10d/core/deadline.h"
#include "c10d/core/exception.h"
#include "c10d/core/reduce.h"

namespace c10d::net {

using core::Deadline;
using core::detail::str_cat;

namespace {

constexpr uint32_t kMagic = 0x63313064;  // "c10d"
// A blocked transfer looks at abort() this often.
constexpr int kPollSliceMs = 200;
// Received bytes are folded into the sum in pieces of this size while the rest arrives (a
// multiple of every element size).
constexpr size_t kFoldBytes = 64 << 10;

struct Hello {
  uint32_t magic;
  uint32_t index;
};

// Sent ahead of every operation's data, so that members running different operations fail
// with a message instead of mixing their bytes.
struct Header {
  pg::Signature call;  // the user's collective
  uint64_t bytes;
  uint32_t kind;  // one of the k* below
  int32_t root;   // broadcast's root member, else -1
};
constexpr uint32_t kAllreduce = 1, kAllgather = 2, kBroadcast = 3, kCheck = 4;

void set_nodelay_nonblocking(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
}

}  // namespace

std::pair<int64_t, int64_t> part_of(int64_t n, int parts, int part) {
  const int64_t base = n / parts, extra = n % parts;
  const int64_t offset = part * base + std::min<int64_t>(part, extra);
  return {offset, base + (part < extra ? 1 : 0)};
}

Ring::Ring(std::shared_ptr<store::Store> store, int index, std::vector<int> ranks,
           const std::string& listen_ip, pg::Millis timeout, Label label)
    : store_(std::move(store)), index_(index), size_(static_cast<int>(ranks.size())),
      label_(std::move(label)), ranks_(std::move(ranks)), hosts_(ranks_.size()),
      ports_(ranks_.size()), timeout_(timeout) {
  try {
    connect_ring(listen_ip, Deadline(timeout));
  } catch (...) {
    close_fds();  // no destructor runs after a constructor throws
    throw;
  }
}

void Ring::connect_ring(const std::string& listen_ip, const Deadline& deadline) {
  store::Store& store = *store_;
  const pg::Millis timeout = timeout_;
  const bool v6 = listen_ip.find(':') != std::string::npos;
  sockaddr_storage addr{};
  socklen_t len = 0;
  if (v6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
    a->sin6_family = AF_INET6;
    if (::inet_pton(AF_INET6, listen_ip.c_str(), &a->sin6_addr) != 1)
      len = 0;
    else
      len = sizeof(*a);
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&addr);
    a->sin_family = AF_INET;
    if (::inet_pton(AF_INET, listen_ip.c_str(), &a->sin_addr) == 1) len = sizeof(*a);
  }
  if (len == 0) fail(str_cat("cannot listen on '", listen_ip, "': not an IP address"), false);
  listen_fd_ = ::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      ::listen(listen_fd_, 4) != 0 ||
      ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    fail(str_cat("cannot listen on ", listen_ip, ": ", errno_text(errno)), false);
  }
  const int port = ntohs(v6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                            : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  std::vector<std::string> keys;
  for (int m = 0; m < size_; ++m) keys.push_back(str_cat("ring/", m));
  store.set(keys[index_], store::to_bytes(str_cat(listen_ip, " ", port)));
  try {
    store.wait(keys, deadline.infinite() ? store.timeout()
                                         : std::max(deadline.remaining(), pg::Millis(1)));
  } catch (const core::DistError& e) {
    std::string missing;
    for (int m = 0; m < size_; ++m) {
      bool there = false;
      try {
        there = store.check({keys[m]});
      } catch (const core::DistError&) {  // the store is gone too: name every other member
      }
      if (!there && m != index_) missing += str_cat(missing.empty() ? "" : ", ", ranks_[m]);
    }
    fail(str_cat("the addresses of ranks ", missing, " did not arrive in the store within ",
                 core::format_timeout(timeout), ": ", e.what()),
         true);
  }
  for (int m = 0; m < size_; ++m) {
    const std::string value = store::to_string(store.get(keys[m]));
    const size_t space = value.find(' ');
    hosts_[m] = value.substr(0, space);
    ports_[m] = std::stoi(value.substr(space + 1));
  }

  // Connect to the next member (its listener queues us before it accepts), then accept the
  // previous one; both say who they are first.
  const int next = (index_ + 1) % size_;
  {
    net::Status status;
    for (;;) {
      status =
          net::Socket::connect(hosts_[next], static_cast<uint16_t>(ports_[next]), deadline, next_);
      if (status.ok() || status.error != ECONNREFUSED || deadline.expired()) break;
      ::usleep(10'000);
    }
    if (!status.ok()) {
      fail(str_cat("cannot connect to ", describe(next), ": ", status.message), false);
    }
    next_.set_peer_name(describe(next));
    const Hello hello{kMagic, static_cast<uint32_t>(index_)};
    next_.send_all(&hello, sizeof(hello), deadline);
  }
  const int prev = (index_ + size_ - 1) % size_;
  while (prev_.fd < 0) {
    if (wait_for(listen_fd_, POLLIN, deadline) == 0) {
      fail(str_cat("Timed out after ", core::format_timeout(timeout),
                   " waiting for the connection of ", describe(prev)),
           true);
    }
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    set_nodelay_nonblocking(fd);
    Hello hello{};
    size_t got = 0;
    while (got < sizeof(hello) && wait_for(fd, POLLIN, deadline) != 0) {
      const ssize_t n = ::recv(fd, reinterpret_cast<char*>(&hello) + got, sizeof(hello) - got, 0);
      if (n <= 0 && !(n < 0 && (errno == EAGAIN || errno == EINTR))) break;
      if (n > 0) got += static_cast<size_t>(n);
    }
    if (got == sizeof(hello) && hello.magic == kMagic &&
        hello.index == static_cast<uint32_t>(prev)) {
      prev_ = Peer{fd, prev};
    } else {
      ::close(fd);  // not our previous member: a stray connection
    }
  }
  ::close(listen_fd_);
  listen_fd_ = -1;
  connecting_ = false;
}

Ring::~Ring() { close_fds(); }

void Ring::close_fds() {
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (prev_.fd >= 0) ::close(prev_.fd);
  listen_fd_ = prev_.fd = -1;
}

void Ring::abort() {
  if (!aborted_.exchange(true)) report("the backend was shut down", false);
  // Wakes a poll() on them; the fds stay open until the destructor.
  if (next_.valid()) ::shutdown(next_.fd(), SHUT_RDWR);
  if (prev_.fd >= 0) ::shutdown(prev_.fd, SHUT_RDWR);
}

std::string Ring::describe(int index) const {
  return str_cat("rank ", ranks_[index], " on host ", hosts_[index], " (ring member ", index,
                 ", port ", ports_[index], ")");
}

std::string Ring::describe_op() const {
  if (connecting_) return str_cat("connect (rank ", ranks_[index_], ")");
  // A check moves no data: no bytes to name.
  return str_cat(op_.name(), " (sequence ", op_.seq, ", rank ", ranks_[index_],
                 op_bytes_ == 0 ? std::string() : str_cat(", ", op_bytes_, " bytes"), ")");
}

void Ring::mark_broken(const std::string& message, bool timeout) {
  if (!broken_.empty()) return;
  broken_ = message;
  report(message, timeout);
  // The streams are out of step: the neighbours learn at once instead of at their timeout.
  if (next_.valid()) ::shutdown(next_.fd(), SHUT_RDWR);
  if (prev_.fd >= 0) ::shutdown(prev_.fd, SHUT_RDWR);
}

void Ring::report(const std::string& message, bool timeout) noexcept {
  if (reported_.exchange(true)) return;
  try {
    store_->set(str_cat("failed/", index_), store::to_bytes(str_cat(timeout ? "T" : "E", message)));
  } catch (...) {  // the store is gone too: the neighbours see the connection close alone
  }
}

Ring::Closure Ring::closed_because(int index) const {
  const std::string key = str_cat("failed/", index);
  try {
    store_->wait({key}, std::chrono::seconds(1));
    const std::string report = store::to_string(store_->get(key));
    if (report.empty()) return {};
    return {str_cat(" after it failed: ", report.substr(1)), report[0] == 'T'};
  } catch (const core::DistStoreTimeoutError&) {
    return {" without reporting a failure (its process ended or its host is unreachable)"};
  } catch (...) {
    return {};  // the store is gone: no way to tell
  }
}

void Ring::break_off(const std::string& why) {
  mark_broken(str_cat(label_.before, " ", describe_op(), label_.after, ": ", why), false);
}

void Ring::fail(const std::string& what, bool timeout) {
  const std::string message = str_cat(label_.before, " ", describe_op(), label_.after, ": ", what);
  if (!connecting_) mark_broken(message, timeout);
  if (timeout) throw core::DistTimeoutError(message);
  if (connecting_) throw core::DistNetworkError(message);
  throw core::DistBackendError(message);
}

template <typename OnReceived>
void Ring::exchange(const char* out, size_t out_bytes, char* in, size_t in_bytes,
                    const Deadline& deadline, OnReceived received, bool relay) {
  const int next = (index_ + 1) % size_;
  size_t sent = 0, got = 0;
  while (sent < out_bytes || got < in_bytes) {
    bool moved = false;
    const size_t sendable = relay ? std::min(out_bytes, got) : out_bytes;
    if (sent < sendable) {
      const ssize_t n =
          ::send(next_.fd(), out + sent, sendable - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        sent += static_cast<size_t>(n);
        moved = true;
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        const int err = errno;
        const Closure closure = closed_because(next);
        fail(str_cat("sending to ", describe(next), " failed (", errno_text(err),
                     "): it closed the connection", closure.why),
             closure.timeout);
      }
    }
    if (got < in_bytes) {
      const ssize_t n = ::recv(prev_.fd, in + got, in_bytes - got, MSG_DONTWAIT);
      if (n > 0) {
        got += static_cast<size_t>(n);
        received(got);
        moved = true;
      } else if (n == 0) {
        const Closure closure = closed_because(prev_.index);
        fail(str_cat(describe(prev_.index), " closed the connection", closure.why),
             closure.timeout);
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        fail(str_cat("receiving from ", describe(prev_.index), " failed: ", errno_text(errno)),
             false);
      }
    }
    if (moved) continue;
    if (aborted_) fail("the backend was shut down", false);
    if (deadline.expired()) {
      // "Timed out" between spaces, as torch's messages have it (its users match on that).
      fail(got < in_bytes ? str_cat("Timed out after ", core::format_timeout(timeout_),
                                    " waiting for data from ", describe(prev_.index), " (", got,
                                    " of ", in_bytes, " bytes arrived)")
                          : str_cat("Timed out after ", core::format_timeout(timeout_), " while ",
                                    describe(next), " took no data (", sent, " of ", out_bytes,
                                    " bytes sent)"),
           true);
    }
    pollfd fds[2];
    nfds_t count = 0;
    if (sent < sendable) fds[count++] = pollfd{next_.fd(), POLLOUT, 0};
    if (got < in_bytes) fds[count++] = pollfd{prev_.fd, POLLIN, 0};
    const auto left = deadline.remaining();
    const int ms = static_cast<int>(std::min<int64_t>(left.count(), kPollSliceMs));
    ::poll(fds, count, ms);
  }
}

Deadline Ring::begin(uint32_t kind, const pg::Signature& call, size_t bytes, int root,
                     pg::Millis timeout) {
  op_ = call;
  op_bytes_ = bytes;
  if (!broken_.empty()) {
    throw core::DistBackendError(str_cat(label_.before, " ", describe_op(), label_.after,
                                         ": the ring broke earlier: ", broken_));
  }
  const Deadline deadline(timeout);
  timeout_ = timeout;
  if (size_ == 1) return deadline;
  const Header mine{call, bytes, kind, root};
  Header theirs{};
  exchange(reinterpret_cast<const char*>(&mine), sizeof(mine), reinterpret_cast<char*>(&theirs),
           sizeof(theirs), deadline, [](size_t) {});
  if (theirs.call != mine.call || theirs.bytes != mine.bytes || theirs.kind != mine.kind ||
      theirs.root != mine.root) {
    // The same call with other ring steps: callers that split one call differently.
    const auto step = [&](const Header& h) {
      return theirs.call != mine.call
                 ? std::string()
                 : str_cat(" (", h.bytes, " bytes on the ring",
                           h.root >= 0 ? str_cat(" from member ", h.root) : "", ")");
    };
    fail(str_cat(describe(prev_.index), " runs ", theirs.call.str(), step(theirs),
                 " where this rank runs ", mine.call.str(), step(mine),
                 ": the ranks called different collectives"),
         false);
  }
  return deadline;
}

template <typename Chunk>
void Ring::gather_around(char* bytes, Chunk chunk, int shift, const Deadline& deadline) {
  for (int s = 0; s < size_ - 1; ++s) {
    const auto [out_offset, out_bytes] = chunk(index_ + shift - s);
    const auto [in_offset, in_bytes] = chunk(index_ + shift - s - 1);
    exchange(bytes + out_offset, out_bytes, bytes + in_offset, in_bytes, deadline, [](size_t) {});
  }
}

void Ring::check(pg::Millis timeout, const pg::Signature& call) {
  begin(kCheck, call, 0, -1, timeout);
}

void Ring::allgather(void* data, size_t block_bytes, pg::Millis timeout,
                     const pg::Signature& call) {
  const Deadline deadline = begin(kAllgather, call, block_bytes, -1, timeout);
  if (block_bytes == 0 || size_ == 1) return;
  auto chunk = [&](int m) {
    return std::pair<size_t, size_t>{static_cast<size_t>((m + size_) % size_) * block_bytes,
                                     block_bytes};
  };
  gather_around(static_cast<char*>(data), chunk, 0, deadline);
}

void Ring::broadcast(void* data, size_t bytes, int root, pg::Millis timeout,
                     const pg::Signature& call) {
  const Deadline deadline = begin(kBroadcast, call, bytes, root, timeout);
  if (size_ == 1) return;
  // Nothing to send: a one-byte token travels the ring instead, so that a member that failed
  // its check stops the token (and with it the root) as it would stop the data.
  char token = 0;
  auto* p = bytes == 0 ? &token : static_cast<char*>(data);
  if (bytes == 0) bytes = 1;
  const bool last = (index_ + 1) % size_ == root;  // the member before the root keeps it
  // With three members or more the last one answers the root once it has the data: a root
  // whose neighbour agreed would otherwise return while members further round the ring fail
  // (each header check sees one neighbour; a failure closes the streams on down the ring).
  const bool answer = size_ > 2;
  char done = 1;
  if (index_ == root) {
    exchange(p, bytes, &done, answer ? 1 : 0, deadline, [](size_t) {});
  } else {
    exchange(
        p, last ? 0 : bytes, p, bytes, deadline, [](size_t) {}, /*relay=*/true);
    if (last && answer) exchange(&done, 1, nullptr, 0, deadline, [](size_t) {});
  }
}

void Ring::allreduce(void* data, size_t count, core::DType dtype, const core::ReduceOp& op,
                     pg::Millis timeout, const pg::Signature& call) {
  const size_t elem = core::element_size(dtype);
  const Deadline deadline = begin(kAllreduce, call, count * elem, -1, timeout);
  if (count == 0 || size_ == 1) return;
  auto* bytes = static_cast<char*>(data);
  auto chunk = [&](int c) {
    const auto [offset, n] = part_of(static_cast<int64_t>(count), size_, (c + size_) % size_);
    return std::pair<size_t, size_t>{static_cast<size_t>(offset) * elem,
                                     static_cast<size_t>(n) * elem};
  };
  // Reduce-scatter: after step s this member holds the sum of s + 2 members' parts of chunk
  // index - s - 1; at the end, all members' sum of chunk index + 1.
  for (int s = 0; s < size_ - 1; ++s) {
    const auto [out_offset, out_bytes] = chunk(index_ - s);
    const auto [in_offset, in_bytes] = chunk(index_ - s - 1);
    incoming_.resize(std::max(incoming_.size(), in_bytes));
    char* dst = bytes + in_offset;
    const char* src = incoming_.data();
    size_t folded = 0;
    exchange(bytes + out_offset, out_bytes, incoming_.data(), in_bytes, deadline, [&](size_t got) {
      const size_t upto = got == in_bytes ? got : got / kFoldBytes * kFoldBytes;
      if (upto > folded) {
        core::reduce(dst + folded, src + folded, (upto - folded) / elem, dtype, op);
        folded = upto;
      }
    });
  }
  // All-gather: pass the finished chunks on around the ring.
  gather_around(bytes, chunk, 1, deadline);
}

}  // namespace c10d::net
