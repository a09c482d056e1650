#include "c10d/net/socket.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "c10d/core/exception.h"

namespace c10d::net {
namespace {

using core::detail::str_cat;

// poll() timeout for the time left before `deadline` (-1 = none), rounded up so that we never
// spin on a sub-millisecond remainder.
int poll_timeout(const core::Deadline& deadline) {
  if (deadline.infinite()) return -1;
  auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline.time_point() -
                                                                    core::Clock::now());
  if (left.count() <= 0) return 0;
  auto ms = (left.count() + 999) / 1000;
  return static_cast<int>(std::min<int64_t>(ms, 1 << 30));
}

}  // namespace

std::string errno_text(int err) { return std::strerror(err); }

int wait_for(int fd, short events, const core::Deadline& deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    int timeout = poll_timeout(deadline);
    int rc = ::poll(&p, 1, timeout);
    if (rc > 0) return 1;
    if (rc == 0) {
      if (deadline.expired()) return 0;
      continue;
    }
    if (errno == EINTR) continue;
    return -errno;
  }
}

namespace {

std::string host_port(const std::string& host, uint16_t port) {
  // IPv6 literals are bracketed so the port stays readable.
  if (host.find(':') != std::string::npos) return str_cat("[", host, "]:", port);
  return str_cat(host, ":", port);
}

Status connect_one(const addrinfo* ai, const core::Deadline& deadline, int& out_fd) {
  int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
  if (fd < 0) return {errno, errno_text(errno)};
  auto fail = [&](int err) {
    ::close(fd);
    return Status{err, errno_text(err)};
  };
  if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
    if (errno != EINPROGRESS && errno != EINTR) return fail(errno);
    int rc = wait_for(fd, POLLOUT, deadline);
    if (rc == 0) return fail(ETIMEDOUT);
    if (rc < 0) return fail(-rc);
    int err = 0;
    socklen_t len = sizeof err;
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) return fail(errno);
    if (err != 0) return fail(err);
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  out_fd = fd;
  return Status::success();
}

}  // namespace

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = std::exchange(other.fd_, -1);
    peer_ = std::move(other.peer_);
    rbuf_ = std::move(other.rbuf_);
    rpos_ = std::exchange(other.rpos_, 0);
    rend_ = std::exchange(other.rend_, 0);
  }
  return *this;
}

void Socket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  rpos_ = rend_ = 0;
}

Status Socket::connect(const std::string& host, uint16_t port, const core::Deadline& deadline,
                       Socket& out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* list = nullptr;
  std::string service = std::to_string(port);
  int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &list);
  if (rc != 0) {
    int err = rc == EAI_SYSTEM ? errno : EHOSTUNREACH;
    return {err == 0 ? EHOSTUNREACH : err,
            str_cat("cannot resolve ", host_port(host, port), ": ", gai_strerror(rc))};
  }
  Status last{ECONNREFUSED, "no address"};
  int fd = -1;
  for (const addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
    last = connect_one(ai, deadline, fd);
    if (last.ok()) break;
    if (deadline.expired()) break;
  }
  ::freeaddrinfo(list);
  if (!last.ok()) {
    last.message = str_cat("connect to ", host_port(host, port), " failed: ", last.message);
    return last;
  }
  out = Socket(fd);
  out.peer_ = host_port(host, port);
  return Status::success();
}

void Socket::send_all(const void* data, size_t size, const core::Deadline& deadline) {
  C10D_CHECK_T(core::DistNetworkError, valid(), "send to ", peer_, " on a closed socket");
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::send(fd_, p, size, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      int rc = wait_for(fd_, POLLOUT, deadline);
      if (rc == 0) {
        throw core::DistTimeoutError(
            str_cat("timed out sending to ", peer_, " (", size, " bytes left)"));
      }
      if (rc < 0) {
        throw core::DistNetworkError(str_cat("send to ", peer_, " failed: ", errno_text(-rc)));
      }
      continue;
    }
    int err = n < 0 ? errno : EPIPE;
    if (err == EPIPE || err == ECONNRESET) {
      throw core::DistNetworkError(
          str_cat(peer_, " closed the connection (", errno_text(err), ")"));
    }
    throw core::DistNetworkError(str_cat("send to ", peer_, " failed: ", errno_text(err)));
  }
}

bool Socket::wait_readable(const core::Deadline& deadline) {
  if (rpos_ < rend_) return true;
  C10D_CHECK_T(core::DistNetworkError, valid(), "receive from ", peer_, " on a closed socket");
  int rc = wait_for(fd_, POLLIN, deadline);
  if (rc < 0) {
    throw core::DistNetworkError(str_cat("receive from ", peer_, " failed: ", errno_text(-rc)));
  }
  return rc > 0;
}

void Socket::fill(const core::Deadline& deadline) {
  // Only called once everything buffered has been consumed.
  rpos_ = rend_ = 0;
  if (!rbuf_) rbuf_.reset(new char[kReadChunk]);
  while (true) {
    if (!wait_readable(deadline)) {
      throw core::DistTimeoutError(str_cat("timed out waiting for a reply from ", peer_));
    }
    ssize_t n = ::recv(fd_, rbuf_.get(), kReadChunk, 0);
    if (n > 0) {
      rend_ = static_cast<size_t>(n);
      return;
    }
    if (n == 0) throw core::DistNetworkError(str_cat(peer_, " closed the connection"));
    if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
    if (errno == ECONNRESET) {
      throw core::DistNetworkError(
          str_cat(peer_, " closed the connection (", errno_text(errno), ")"));
    }
    throw core::DistNetworkError(str_cat("receive from ", peer_, " failed: ", errno_text(errno)));
  }
}

void Socket::recv_exact(void* data, size_t size, const core::Deadline& deadline) {
  char* out = static_cast<char*>(data);
  while (size > 0) {
    if (rpos_ == rend_) fill(deadline);
    size_t n = std::min(size, rend_ - rpos_);
    std::memcpy(out, rbuf_.get() + rpos_, n);
    rpos_ += n;
    out += n;
    size -= n;
  }
}

}  // namespace c10d::net
