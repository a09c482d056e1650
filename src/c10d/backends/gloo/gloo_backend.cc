#include "c10d/backends/gloo/gloo_backend.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/gather.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/scatter.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include "c10d/backends/gloo/store_adapter.h"
#include "c10d/core/env.h"
#include "c10d/core/exception.h"
#include "c10d/core/reduce.h"
#include "c10d/store/prefix_store.h"
#include "c10d/store/tcp_store.h"

namespace c10d::backends::gloo {

using core::DistBackendError;
using core::DistTimeoutError;
using core::DType;
using core::OpType;
using core::ReduceOp;
using core::Tensor;
using core::detail::str_cat;
using pg::Millis;
using pg::wants_async;

namespace {

// Gloo reads a zero timeout as "use the default" in some places and rejects it in others, so
// "no timeout" becomes 30 days (longer would overflow nanosecond deadlines inside Gloo).
constexpr Millis kForever = std::chrono::hours(24 * 30);
// Slot prefix of monitored_barrier's messages. Gloo's collectives use prefixes 0x01-0x08 in the
// top byte of the slot and point-to-point slots leave it 0, so this cannot collide.
constexpr uint64_t kMonitoredBarrierPrefix = 0x10;
// Size of one element in Gloo's eyes. Only sizeof matters: our own reduce function does the
// arithmetic, so bfloat16, complex and bool travel as opaque elements of the right width.
template <size_t N>
struct Element {
  unsigned char bytes[N];
};

Millis resolve_timeout(Millis timeout) { return timeout <= Millis::zero() ? kForever : timeout; }

// Gloo treats a zero-millisecond wait as "no timeout"; never pass it one.
Millis at_least_1ms(Millis timeout) { return std::max(timeout, Millis(1)); }

// Zero-element tensors may have no storage; Gloo wants a valid pointer all the same.
void* data_or_dummy(const Tensor& tensor) {
  static unsigned char dummy;
  return tensor.data() != nullptr ? tensor.data() : &dummy;
}

template <typename Fn>
void with_element_type(size_t element_size, Fn&& fn) {
  switch (element_size) {
    case 1: fn.template operator()<Element<1>>(); return;
    case 2: fn.template operator()<Element<2>>(); return;
    case 4: fn.template operator()<Element<4>>(); return;
    case 8: fn.template operator()<Element<8>>(); return;
    case 16: fn.template operator()<Element<16>>(); return;
    default: throw DistBackendError(str_cat("Gloo: no element type of ", element_size, " bytes"));
  }
}

// The combine step Gloo calls between contributions: out = a (op) b.
::gloo::AllreduceOptions::Func make_reduce_fn(DType dtype, ReduceOp op) {
  // AVG and PREMUL_SUM combine like SUM; their pre/post steps happen once, outside Gloo.
  if (op.kind == ReduceOp::AVG || op.kind == ReduceOp::PREMUL_SUM) op = ReduceOp(ReduceOp::SUM);
  return [dtype, op](void* out, const void* a, const void* b, size_t n) {
    core::reduce_into(out, a, b, n, dtype, op);
  };
}

bool is_gloo_timeout(const std::string& message) {
  return message.find("Timed out") != std::string::npos ||
         message.find("timed out") != std::string::npos ||
         message.find("Timeout") != std::string::npos;
}

// Elementwise copy of a contiguous tensor's bytes.
void copy_bytes(void* dst, const void* src, size_t n) {
  if (n != 0) std::memcpy(dst, src, n);
}

// In-place allreduce of `n` elements at each pointer in `data` (all the same dtype).
void run_allreduce(const GlooBackend::OpContext& c, const std::vector<void*>& data, size_t n,
                   DType dtype, const ReduceOp& op) {
  if (n == 0) return;
  for (void* p : data) core::apply_premul(p, n, dtype, op);
  ::gloo::AllreduceOptions g(c.context);
  with_element_type(core::element_size(dtype), [&]<typename T>() {
    std::vector<T*> ptrs;
    ptrs.reserve(data.size());
    for (void* p : data) ptrs.push_back(static_cast<T*>(p));
    g.setOutputs(ptrs, n);
  });
  g.setReduceFunction(make_reduce_fn(dtype, op));
  g.setTag(c.tag);
  g.setTimeout(c.timeout);
  ::gloo::allreduce(g);
  for (void* p : data) core::apply_postdiv(p, n, dtype, op, c.size);
}

void run_allgather(const GlooBackend::OpContext& c, void* in, void* out, size_t bytes_per_rank) {
  if (bytes_per_rank == 0) return;
  ::gloo::AllgatherOptions g(c.context);
  g.setInput(static_cast<char*>(in), bytes_per_rank);
  g.setOutput(static_cast<char*>(out), bytes_per_rank * c.size);
  g.setTag(c.tag);
  g.setTimeout(c.timeout);
  ::gloo::allgather(g);
}

// Reduce-scatter of `input` (size * output.numel() elements, not modified) into `output`:
// an allreduce of a copy, then this rank's slice. Gloo has no options-style reduce-scatter.
void run_reduce_scatter(const GlooBackend::OpContext& c, Tensor& output, const Tensor& input,
                        const ReduceOp& op) {
  const size_t n = static_cast<size_t>(output.numel());
  if (n == 0) return;
  Tensor scratch = input.contiguous_copy();
  ReduceOp sum_op = op;
  if (op.kind == ReduceOp::AVG) sum_op = ReduceOp(ReduceOp::SUM);
  run_allreduce(c, {scratch.data()}, n * c.size, input.dtype(), sum_op);
  copy_bytes(output.data(), static_cast<char*>(scratch.data()) + c.rank * output.nbytes(),
             output.nbytes());
  core::apply_postdiv(output.data(), n, output.dtype(), op, c.size);
}

// Gloo's all-to-all with per-rank byte counts (which may be zero).
void run_alltoallv(const GlooBackend::OpContext& c, void* in, std::vector<int64_t> in_bytes,
                   void* out, std::vector<int64_t> out_bytes) {
  ::gloo::AlltoallvOptions g(c.context);
  g.setInput(static_cast<char*>(in), std::move(in_bytes));
  g.setOutput(static_cast<char*>(out), std::move(out_bytes));
  g.setTag(c.tag);
  g.setTimeout(c.timeout);
  ::gloo::alltoallv(g);
}

enum class WaitResult { kDone, kTimedOut, kAborted };

// Waits for the pending send or receive on `buffer` for up to `limit`. Gloo's own timeout is
// not used because it closes every connection of the context ("Application timeout caused pair
// closure"); a watchdog thread aborts the wait instead, leaving the context usable. For the
// rare waits that must survive a timeout (monitored_barrier, Work::wait with a short timeout).
// I/O errors still throw Gloo's exception.
WaitResult wait_or_abort(::gloo::transport::UnboundBuffer& buffer, bool is_send, Millis limit,
                         int* rank = nullptr) {
  std::mutex mutex;
  std::condition_variable cv;
  bool finished = false;
  bool fired = false;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> lock(mutex);
    if (!cv.wait_for(lock, limit, [&] { return finished; })) {
      fired = true;
      if (is_send) {
        buffer.abortWaitSend();
      } else {
        buffer.abortWaitRecv();
      }
    }
  });
  auto stop_watchdog = [&] {
    {
      std::lock_guard<std::mutex> lock(mutex);
      finished = true;
    }
    cv.notify_one();
    watchdog.join();
  };
  bool done;
  try {
    done = is_send ? buffer.waitSend(rank, kForever) : buffer.waitRecv(rank, kForever);
  } catch (...) {
    stop_watchdog();
    throw;
  }
  stop_watchdog();
  if (done) return WaitResult::kDone;
  return fired ? WaitResult::kTimedOut : WaitResult::kAborted;
}

// Whether `host` resolves to an address this machine can bind (so peers could reach us there).
// Calls visit(address) for each address `host` (with `service`) resolves to, until it
// returns true; returns whether it did (false when nothing resolves).
template <typename Visit>
bool any_address(const std::string& host, const char* service, int socktype, int flags,
                 Visit visit) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = socktype;
  hints.ai_flags = flags;
  addrinfo* result = nullptr;
  if (::getaddrinfo(host.c_str(), service, &hints, &result) != 0) return false;
  bool hit = false;
  for (addrinfo* ai = result; ai != nullptr && !hit; ai = ai->ai_next) hit = visit(*ai);
  ::freeaddrinfo(result);
  return hit;
}

bool hostname_is_bindable(const std::string& host) {
  return any_address(host, nullptr, SOCK_STREAM, 0, [](const addrinfo& ai) {
    const int fd = ::socket(ai.ai_family, ai.ai_socktype, ai.ai_protocol);
    if (fd < 0) return false;
    const bool ok = ::bind(fd, ai.ai_addr, ai.ai_addrlen) == 0;
    ::close(fd);
    return ok;
  });
}

// Whether every address `host` resolves to is a loopback address (false if it resolves to
// none): Debian's /etc/hosts maps the hostname to 127.0.1.1.
bool resolves_to_loopback(const std::string& host) {
  bool any = false;
  const bool other = any_address(host, nullptr, SOCK_STREAM, 0, [&](const addrinfo& ai) {
    any = true;
    if (ai.ai_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(ai.ai_addr);
      return (ntohl(in->sin_addr.s_addr) >> 24) != 127;
    }
    if (ai.ai_family == AF_INET6) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(ai.ai_addr);
      return !IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr) &&
             !(IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr) && in6->sin6_addr.s6_addr[12] == 127);
    }
    return false;
  });
  return any && !other;
}

// The local address the routing table picks to reach `host` ("" if it has none): a UDP
// socket's connect sends nothing, it only chooses the route.
std::string address_towards(const std::string& host) {
  std::string found;
  any_address(host, "9", SOCK_DGRAM, 0, [&](const addrinfo& ai) {
    const int fd = ::socket(ai.ai_family, SOCK_DGRAM, 0);
    if (fd < 0) return false;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (::connect(fd, ai.ai_addr, ai.ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char text[INET6_ADDRSTRLEN] = {};
      const void* addr = local.ss_family == AF_INET
                             ? static_cast<const void*>(
                                   &reinterpret_cast<const sockaddr_in*>(&local)->sin_addr)
                             : &reinterpret_cast<const sockaddr_in6*>(&local)->sin6_addr;
      if (::inet_ntop(local.ss_family, addr, text, sizeof(text)) != nullptr) found = text;
    }
    ::close(fd);
    return !found.empty();
  });
  return found;
}

// The peers (by rank, from their "[ip]:port" addresses) whose host does not answer a TCP
// connection attempt within `wait`: a refusal or an accepted connection is an answer, silence
// means the host or the network to it is down. Every attempt runs at once.
std::vector<int> silent_peers(const std::vector<std::vector<std::string>>& addresses,
                              std::chrono::milliseconds wait) {
  struct Attempt {
    int rank;
    int fd;
  };
  std::vector<Attempt> attempts;
  std::vector<int> silent;
  for (size_t r = 0; r < addresses.size(); ++r) {
    for (const std::string& address : addresses[r]) {
      const size_t close = address.find("]:");
      if (address.empty() || address[0] != '[' || close == std::string::npos) continue;
      const std::string ip = address.substr(1, close - 1);
      const std::string port = address.substr(close + 2);
      const bool tried = any_address(ip, port.c_str(), SOCK_STREAM,
                                     AI_NUMERICHOST | AI_NUMERICSERV, [&](const addrinfo& ai) {
        const int fd = ::socket(ai.ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) return true;
        const int rc = ::connect(fd, ai.ai_addr, ai.ai_addrlen);
        if (rc == 0 || errno == ECONNREFUSED) {
          ::close(fd);  // answered at once
        } else if (errno == EINPROGRESS) {
          attempts.push_back({static_cast<int>(r), fd});
        } else {
          ::close(fd);
          silent.push_back(static_cast<int>(r));  // no route to it
        }
        return true;
      });
      if (tried) break;  // one address per peer
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + wait;
  std::vector<pollfd> fds;
  for (const Attempt& a : attempts) fds.push_back({a.fd, POLLOUT, 0});
  size_t open = fds.size();
  while (open > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    const int n = ::poll(fds.data(), fds.size(), static_cast<int>(left.count()));
    if (n < 0 && errno != EINTR) break;
    for (pollfd& p : fds) {
      if (p.fd >= 0 && p.revents != 0) {  // connected, refused or reset: an answer
        p.fd = -p.fd - 1;
        --open;
      }
    }
  }
  for (size_t i = 0; i < attempts.size(); ++i) {
    if (fds[i].fd >= 0) silent.push_back(attempts[i].rank);
    ::close(attempts[i].fd);
  }
  std::sort(silent.begin(), silent.end());
  return silent;
}

// " ranks 2, 3 (at 10.0.0.2) and rank 5 (at 10.0.0.3) did not answer ..." for the timeout
// message, or "" when every peer's host answered.
std::string silent_peers_note(const std::vector<std::vector<std::string>>& addresses) {
  const std::vector<int> silent = silent_peers(addresses, std::chrono::seconds(1));
  if (silent.empty()) return "";
  std::vector<std::pair<std::string, std::vector<int>>> by_host;
  for (int r : silent) {
    const std::string& a = addresses[r].front();
    const std::string host = a.substr(1, a.find("]:") - 1);
    auto it = std::find_if(by_host.begin(), by_host.end(),
                           [&](const auto& h) { return h.first == host; });
    if (it == by_host.end()) it = by_host.insert(by_host.end(), {host, {}});
    it->second.push_back(r);
  }
  std::string note = "; unreachable:";
  for (size_t h = 0; h < by_host.size(); ++h) {
    const auto& ranks = by_host[h].second;
    note += str_cat(h == 0 ? " " : ", ", ranks.size() == 1 ? "rank " : "ranks ");
    for (size_t i = 0; i < ranks.size(); ++i) note += str_cat(i == 0 ? "" : ", ", ranks[i]);
    note += str_cat(" on host ", by_host[h].first);
  }
  return note + " (no answer to a connection attempt within 1s: that host or the network to "
                "it is down)";
}

// The host other ranks rendezvous at, when `store` is (or wraps) a TCPStore, else "".
std::string store_host(const std::shared_ptr<store::Store>& store) {
  std::shared_ptr<store::Store> s = store;
  if (const auto* prefix = dynamic_cast<const store::PrefixStore*>(s.get())) {
    s = prefix->underlying_non_prefix_store();
  }
  const auto* tcp = dynamic_cast<const store::TCPStore*>(s.get());
  return tcp != nullptr ? tcp->host() : "";
}

// Gloo writes to its sockets with writev, which raises SIGPIPE when a peer has gone away; the
// default action would kill the process instead of letting the write fail with EPIPE (which
// becomes an error naming the peer). A handler the application installed is left alone.
void ignore_sigpipe_once() {
  static const bool done = [] {
    struct sigaction current {};
    if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL &&
        !(current.sa_flags & SA_SIGINFO)) {
      ::signal(SIGPIPE, SIG_IGN);
    }
    return true;
  }();
  (void)done;
}

// The non-empty pieces of `text` between separators.
std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(separator, start);
    if (end == std::string::npos) end = text.size();
    if (end > start) parts.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return parts;
}

// `text` if it is an address as Gloo's TCP transport prints it ("[127.0.0.1]:41235"), without
// the "$<sequence>" some Gloo versions append; otherwise "".
std::string tcp_address_text(std::string text) {
  if (size_t cut = text.find('$'); cut != std::string::npos) text.resize(cut);
  return text.find("]:") != std::string::npos ? text : std::string();
}

// The addresses `rank` advertised at Gloo's rendezvous, by peer, decoded from its record:
// connectFullMesh stores under the rank's number the address of its pair with every other
// rank, in rank order, all of one size. "" where the record does not hold TCP addresses.
std::vector<std::string> advertised_addresses(const store::Bytes& record, int rank, int size) {
  std::vector<std::string> by_peer(size);
  if (size < 2 || record.empty() || record.size() % (size - 1) != 0) return by_peer;
  const size_t width = record.size() / (size - 1);
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    const auto first = record.begin() + (p < rank ? p : p - 1) * width;
    try {
      by_peer[p] = tcp_address_text(
          ::gloo::transport::tcp::Address(std::vector<char>(first, first + width)).str());
    } catch (const std::exception&) {
      // Another transport's record: peers are named by the pairs' current addresses alone.
    }
  }
  return by_peer;
}

// A send or receive posted on an unbound buffer. It completes when waited on: wait() blocks on
// the buffer (up to the operation's deadline, or the caller's shorter timeout, after which the
// operation stays pending and may be waited on again).
class P2PWork : public core::Work {
 public:
  P2PWork(OpType type, std::string description, Tensor tensor,
          std::unique_ptr<::gloo::transport::UnboundBuffer> buffer, Millis timeout,
          std::string context)
      : Work(type, std::move(description)),
        tensor_(std::move(tensor)),
        buffer_(std::move(buffer)),
        deadline_(timeout),
        timeout_(timeout),
        context_(std::move(context)) {}

  bool wait(Millis timeout) override {
    {
      std::lock_guard<std::mutex> lock(wait_mutex_);
      // A send or receive that failed when posted (the pair closed after an earlier timeout)
      // is settled already: its buffer was never posted, so waiting on it cannot end well.
      if (!settled_ && !is_completed()) settle(timeout);
    }
    return Work::wait(core::kNoTimeout);
  }

  bool progresses_in_wait() const override { return true; }

  void abort() override {
    if (op_type() == OpType::kSend) {
      buffer_->abortWaitSend();
    } else {
      buffer_->abortWaitRecv();
    }
  }

 private:
  // Expects wait_mutex_ held.
  void settle(Millis caller_timeout) {
    const Millis left = deadline_.remaining();
    const bool caller_limited = caller_timeout > Millis::zero() && caller_timeout < left;
    const Millis limit = at_least_1ms(caller_limited ? caller_timeout : left);
    const bool is_send = op_type() == OpType::kSend;
    try {
      int rank = -1;
      bool done;
      if (caller_limited) {
        // A short wait must not close the context when it expires: the operation goes on.
        const WaitResult result = wait_or_abort(*buffer_, is_send, limit, &rank);
        if (result == WaitResult::kTimedOut) {
          throw DistTimeoutError(str_cat("Gloo ", context_, " did not complete within ",
                                         core::format_timeout(caller_timeout),
                                         " (it is still pending)"));
        }
        done = result == WaitResult::kDone;
      } else {
        done = is_send ? buffer_->waitSend(&rank, limit) : buffer_->waitRecv(&rank, limit);
      }
      settled_ = true;
      if (!done) {
        finish_with_error(std::make_exception_ptr(
            DistBackendError(str_cat("Gloo ", context_, " was aborted"))));
        return;
      }
      if (!is_send) set_source_rank(rank);
      finish({tensor_});
    } catch (const DistTimeoutError&) {
      throw;  // the caller's own timeout: not settled
    } catch (const std::exception& e) {
      const bool timed_out = is_gloo_timeout(e.what());
      settled_ = true;
      if (timed_out) {
        finish_with_error(std::make_exception_ptr(DistTimeoutError(
            str_cat("Gloo ", context_, " timed out after ", core::format_timeout(timeout_),
                    ": ", e.what(), " (a send matches only a receive with the same tag and "
                    "byte count)"))));
      } else {
        finish_with_error(std::make_exception_ptr(
            DistBackendError(str_cat("Gloo ", context_, " failed: ", e.what()))));
      }
    }
  }

  Tensor tensor_;
  std::unique_ptr<::gloo::transport::UnboundBuffer> buffer_;
  core::Deadline deadline_;
  Millis timeout_;
  std::string context_;
  std::mutex wait_mutex_;
  bool settled_ = false;  // guarded by wait_mutex_
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Devices

DevicePtr GlooBackend::create_device_for_hostname(const std::string& hostname) {
  ::gloo::transport::tcp::attr attr;
  attr.hostname = hostname;
  try {
    return ::gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw core::DistNetworkError(
        str_cat("Gloo: cannot create a TCP device for host '", hostname, "': ", e.what()));
  }
}

DevicePtr GlooBackend::create_device_for_interface(const std::string& ifname) {
  ::gloo::transport::tcp::attr attr;
  attr.iface = ifname;
  try {
    return ::gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw core::DistNetworkError(
        str_cat("Gloo: cannot create a TCP device for interface '", ifname, "': ", e.what()));
  }
}

DevicePtr GlooBackend::create_default_device(const std::string& peer_host) {
  return create_default_devices(peer_host).front();
}

std::vector<DevicePtr> GlooBackend::create_default_devices(const std::string& peer_host) {
  std::vector<DevicePtr> devices;
  if (core::env_is_set(core::kEnvGlooSocketIfname)) {
    for (const auto& ifname : split(core::env_string(core::kEnvGlooSocketIfname), ',')) {
      devices.push_back(create_device_for_interface(ifname));
    }
    if (!devices.empty()) return devices;
  }
  char host[256] = {};
  const bool named = ::gethostname(host, sizeof(host) - 1) == 0 && hostname_is_bindable(host);
  // Ranks on other hosts cannot reach a loopback address: with a peer elsewhere, listen where
  // the route to it leaves this host.
  if ((!named || resolves_to_loopback(host)) && !peer_host.empty() &&
      !resolves_to_loopback(peer_host)) {
    const std::string local = address_towards(peer_host);
    if (!local.empty() && !resolves_to_loopback(local)) {
      devices.push_back(create_device_for_hostname(local));
      return devices;
    }
  }
  devices.push_back(create_device_for_hostname(named ? host : "127.0.0.1"));
  return devices;
}

// ---------------------------------------------------------------------------------------------
// Construction and the worker pool

struct GlooBackend::Shared {
  Shared(int rank, int size) : rank(rank), size(size) {}

  // "allreduce (sequence 3, rank 0 of 2)".
  std::string describe(const char* op, uint32_t tag) const {
    return str_cat(op, " (sequence ", tag, ", rank ", rank, " of ", size, ")");
  }

  // The rank one of whose addresses appears in a Gloo error message, or -1.
  int peer_in_message(const std::string& message) const {
    for (size_t r = 0; r < peer_addresses.size(); ++r) {
      for (const std::string& address : peer_addresses[r]) {
        if (address.empty()) continue;
        // "[127.0.0.1]:4632" must not match inside "[127.0.0.1]:46321".
        for (size_t at = message.find(address); at != std::string::npos;
             at = message.find(address, at + 1)) {
          const size_t end = at + address.size();
          if (end == message.size() || !std::isdigit(static_cast<unsigned char>(message[end]))) {
            return static_cast<int>(r);
          }
        }
      }
    }
    return -1;
  }

  // Turns a Gloo exception into ours, naming the operation, sequence number and peer.
  std::exception_ptr translate(std::exception_ptr error, const char* op_name,
                               const OpContext& op) const noexcept {
    try {
      try {
        std::rethrow_exception(error);
      } catch (const core::DistError&) {
        return error;  // ours already carries its context
      } catch (const std::exception& e) {
        const std::string what = e.what();
        std::string message = str_cat("Gloo ", describe(op_name, op.tag));
        if (int peer = peer_in_message(what); peer >= 0) message += str_cat(" with peer rank ", peer);
        if (is_gloo_timeout(what)) {
          return std::make_exception_ptr(DistTimeoutError(
              str_cat(message, " timed out after ", core::format_timeout(op.timeout), ": ", what,
                      silent_peers_note(peer_addresses))));
        }
        return std::make_exception_ptr(DistBackendError(str_cat(message, " failed: ", what)));
      } catch (...) {
        return std::make_exception_ptr(DistBackendError(
            str_cat("Gloo ", describe(op_name, op.tag), " failed with an unknown error")));
      }
    } catch (...) {
      return std::current_exception();  // allocation failure while building the message
    }
  }

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
};

GlooBackend::GlooBackend(std::shared_ptr<store::Store> store, int rank, int size,
                         GlooOptions opts)
    : pg::Backend(rank, size, opts.timeout),
      store_(std::move(store)),
      devices_(std::move(opts.devices)),
      shared_(std::make_shared<Shared>(rank, size)) {
  ignore_sigpipe_once();
  if (devices_.empty()) devices_ = create_default_devices(store_host(store_));
  const Millis timeout = resolve_timeout(opts.timeout);
  for (size_t i = 0; i < devices_.size(); ++i) {
    auto context = std::make_shared<::gloo::rendezvous::Context>(rank, size);
    context->setTimeout(timeout);
    StoreAdapter adapter(store_, str_cat("gloo/", i, "/"));
    try {
      context->connectFullMesh(adapter, devices_[i]);
    } catch (const std::exception& e) {
      throw DistBackendError(str_cat("Gloo rendezvous failed for rank ", rank, " of ", size,
                                     " through ", store_->describe(), " (device ",
                                     devices_[i]->str(), "): ", e.what()));
    }
    contexts_.push_back(std::move(context));
  }
  exchange_addresses();
  const int threads = std::max(1, opts.threads);
  shared_->running_workers = threads;
  workers_.reserve(threads);
  for (int i = 0; i < threads; ++i) workers_.emplace_back(worker_loop, shared_);
}

GlooBackend::~GlooBackend() { shutdown(); }

void GlooBackend::exchange_addresses() {
  shared_->peer_addresses.assign(size(), {});
  if (size() == 1) return;
  try {
    // One line per device and peer: the peer's rank, then the addresses that may name us in its
    // messages (see Shared::peer_addresses): our pair's address now, and the one it advertised,
    // read back from our rendezvous record (checked first: a get would wait for a missing key).
    std::string mine;
    for (size_t d = 0; d < contexts_.size(); ++d) {
      const std::string record = str_cat("gloo/", d, "/", rank());
      std::vector<std::string> advertised(size());
      if (store_->check({record})) {
        advertised = advertised_addresses(store_->get(record), rank(), size());
      }
      for (int p = 0; p < size(); ++p) {
        if (p == rank()) continue;
        mine += str_cat(p, ' ', tcp_address_text(contexts_[d]->getPair(p)->address().str()), ' ',
                        advertised[p], '\n');
      }
    }
    store_->set(str_cat("gloo/address/", rank()), store::to_bytes(mine));
    const std::string me = std::to_string(rank());
    for (int r = 0; r < size(); ++r) {
      if (r == rank()) continue;
      const std::string theirs = store::to_string(store_->get(str_cat("gloo/address/", r)));
      for (const std::string& line : split(theirs, '\n')) {
        const std::vector<std::string> fields = split(line, ' ');
        if (fields.empty() || fields[0] != me) continue;
        auto& names = shared_->peer_addresses[r];
        names.insert(names.end(), fields.begin() + 1, fields.end());
      }
    }
  } catch (const std::exception& e) {
    throw DistBackendError(str_cat("Gloo rendezvous failed for rank ", rank(), " of ", size(),
                                   " through ", store_->describe(),
                                   " while exchanging addresses: ", e.what()));
  }
}

uint32_t GlooBackend::next_sequence() const {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  return shared_->next_seq;
}

GlooBackend::OpContext GlooBackend::next_op(Millis op_timeout) {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  const uint32_t tag = shared_->next_seq++;
  return OpContext{contexts_[tag % contexts_.size()], tag,
                   resolve_timeout(effective_timeout(op_timeout)), rank(), size()};
}

WorkPtr GlooBackend::submit(OpType type, const char* op_name, Millis op_timeout, bool async,
                            Body body, std::vector<Tensor> outputs) {
  Task task;
  task.name = op_name;
  task.body = std::move(body);
  task.outputs = std::move(outputs);
  Shared& shared = *shared_;
  {
    std::unique_lock<std::mutex> lock(shared.mutex);
    const uint32_t tag = shared.next_seq++;
    task.op = OpContext{contexts_[tag % contexts_.size()], tag,
                        resolve_timeout(effective_timeout(op_timeout)), rank(), size()};
    // Plain concatenation: this runs on every operation's critical path.
    task.work = std::make_shared<core::Work>(
        type, std::string("gloo:") + op_name + "#" + std::to_string(tag));
    if (shared.stopping) {
      lock.unlock();
      task.work->finish_with_error(std::make_exception_ptr(DistBackendError(
          str_cat("Gloo ", shared.describe(op_name, tag), ": the backend was shut down"))));
      return task.work;
    }
    if (async) {
      WorkPtr work = task.work;
      shared.queue.push_back(std::move(task));
      lock.unlock();
      shared.wake.notify_one();
      return work;
    }
  }
  run_task(shared, task);
  return task.work;
}

void GlooBackend::run_task(const Shared& shared, Task& task) noexcept {
  std::exception_ptr error;
  try {
    task.body(task.op);
  } catch (...) {
    error = shared.translate(std::current_exception(), task.name, task.op);
  }
  // shutdown() may have failed the Work already; completing it twice throws.
  try {
    if (error) {
      task.work->finish_with_error(error);
    } else {
      task.work->finish(std::move(task.outputs));
    }
  } catch (...) {
  }
}

void GlooBackend::worker_loop(std::shared_ptr<Shared> shared) {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(shared->mutex);
      shared->wake.wait(lock, [&] { return shared->stopping || !shared->queue.empty(); });
      if (shared->queue.empty()) {
        --shared->running_workers;
        shared->exited.notify_all();
        return;
      }
      task = std::move(shared->queue.front());
      shared->queue.pop_front();
      shared->in_flight.push_back(task.work);
    }
    run_task(*shared, task);
    std::lock_guard<std::mutex> lock(shared->mutex);
    auto& in_flight = shared->in_flight;
    in_flight.erase(std::find(in_flight.begin(), in_flight.end(), task.work));
    shared->exited.notify_all();  // finish_pending() waits for the queue to drain
  }
}

void GlooBackend::finish_pending(Millis timeout) {
  Shared& shared = *shared_;
  std::unique_lock<std::mutex> lock(shared.mutex);
  auto drained = [&] { return shared.queue.empty() && shared.in_flight.empty(); };
  if (timeout <= Millis::zero()) return shared.exited.wait(lock, drained);
  if (shared.exited.wait_for(lock, timeout, drained)) return;
  const std::string first = !shared.in_flight.empty() ? shared.in_flight.front()->description()
                                                      : shared.queue.front().work->description();
  core::log(core::LogLevel::kWarning,
            str_cat("Gloo rank ", rank(), " of ", size(), ": ",
                    shared.queue.size() + shared.in_flight.size(), " operation(s) (first: ",
                    first, ") did not finish within ", core::format_timeout(timeout),
                    " while the backend shut down; they fail"));
}

void GlooBackend::shutdown() {
  std::lock_guard<std::mutex> shutdown_lock(shutdown_mutex_);
  if (workers_.empty()) return;
  Shared& shared = *shared_;
  std::deque<Task> dropped;
  {
    std::lock_guard<std::mutex> lock(shared.mutex);
    shared.stopping = true;
    dropped.swap(shared.queue);
  }
  shared.wake.notify_all();
  for (Task& task : dropped) {
    task.work->finish_with_error(std::make_exception_ptr(DistBackendError(
        str_cat("Gloo ", shared.describe(task.name, task.op.tag),
                ": the backend was shut down before it ran"))));
  }
  // Closing the connections makes peers see us leave, and running operations that touch the
  // network fail. An operation merely waiting on a peer is not woken by Gloo, though, so
  // workers still busy after a short grace period are left to finish (at their timeout) on
  // their own: they hold only the shared state and their task, never the backend.
  for (auto& context : contexts_) {
    try {
      context->closeConnections();
    } catch (...) {
    }
  }
  bool all_exited;
  std::vector<std::shared_ptr<core::Work>> abandoned;
  {
    std::unique_lock<std::mutex> lock(shared.mutex);
    all_exited = shared.exited.wait_for(lock, std::chrono::milliseconds(100),
                                        [&] { return shared.running_workers == 0; });
    if (!all_exited) abandoned = shared.in_flight;
  }
  for (auto& work : abandoned) {
    try {
      work->finish_with_error(std::make_exception_ptr(DistBackendError(
          str_cat("Gloo ", work->description(), " on rank ", rank(), " of ", size(),
                  ": the backend was shut down while it ran"))));
    } catch (...) {
      // It completed in the meantime.
    }
  }
  for (auto& worker : workers_) {
    if (all_exited) {
      worker.join();
    } else {
      worker.detach();
    }
  }
  workers_.clear();
}

// ---------------------------------------------------------------------------------------------
// Collectives

WorkPtr GlooBackend::broadcast(std::vector<Tensor>& tensors, const pg::BroadcastOptions& opts) {
  const int root = static_cast<int>(opts.root_rank);
  const size_t root_tensor = static_cast<size_t>(opts.root_tensor);
  return submit(
      OpType::kBroadcast, "broadcast", opts.timeout, wants_async(opts),
      [tensors, root, root_tensor](const OpContext& c) {
        const Tensor& source = tensors[root_tensor];
        const size_t bytes = source.nbytes();
        if (bytes != 0) {
          ::gloo::BroadcastOptions g(c.context);
          g.setOutput(static_cast<char*>(source.data()), bytes);
          g.setRoot(root);
          g.setTag(c.tag);
          g.setTimeout(c.timeout);
          ::gloo::broadcast(g);
        }
        for (size_t i = 0; i < tensors.size(); ++i) {
          if (i != root_tensor) copy_bytes(tensors[i].data(), source.data(), bytes);
        }
      },
      tensors);
}

WorkPtr GlooBackend::allreduce(std::vector<Tensor>& tensors, const pg::AllreduceOptions& opts) {
  const ReduceOp op = opts.reduce_op;
  return submit(
      OpType::kAllreduce, "allreduce", opts.timeout, wants_async(opts),
      [tensors, op](const OpContext& c) {
        std::vector<void*> data;
        data.reserve(tensors.size());
        for (const Tensor& t : tensors) data.push_back(t.data());
        run_allreduce(c, data, static_cast<size_t>(tensors[0].numel()), tensors[0].dtype(), op);
      },
      tensors);
}

WorkPtr GlooBackend::reduce(std::vector<Tensor>& tensors, const pg::ReduceOptions& opts) {
  const ReduceOp op = opts.reduce_op;
  const int root = static_cast<int>(opts.root_rank);
  const Tensor tensor = tensors[static_cast<size_t>(opts.root_tensor)];
  return submit(
      OpType::kReduce, "reduce", opts.timeout, wants_async(opts),
      [tensor, op, root](const OpContext& c) {
        const size_t n = static_cast<size_t>(tensor.numel());
        if (n == 0) return;
        const DType dtype = tensor.dtype();
        // Only the root's tensor receives the result; the others keep their input, so their
        // contribution is read from the tensor (or a scaled copy) and Gloo works in scratch.
        Tensor input = tensor;
        Tensor output = tensor;
        if (c.rank == root) {
          core::apply_premul(tensor.data(), n, dtype, op);
        } else {
          if (op.kind == ReduceOp::PREMUL_SUM) {
            input = tensor.contiguous_copy();
            core::apply_premul(input.data(), n, dtype, op);
          }
          output = Tensor::empty({static_cast<int64_t>(n)}, dtype);
        }
        ::gloo::ReduceOptions g(c.context);
        with_element_type(core::element_size(dtype), [&]<typename T>() {
          if (input.data() != output.data()) g.setInput(static_cast<T*>(input.data()), n);
          g.setOutput(static_cast<T*>(output.data()), n);
        });
        g.setRoot(root);
        g.setReduceFunction(make_reduce_fn(dtype, op));
        g.setTag(c.tag);
        g.setTimeout(c.timeout);
        ::gloo::reduce(g);
        if (c.rank == root) core::apply_postdiv(tensor.data(), n, dtype, op, c.size);
      },
      tensors);
}

WorkPtr GlooBackend::allgather_base(Tensor& output, Tensor& input,
                                    const pg::AllgatherOptions& opts) {
  return submit(
      OpType::kAllgatherBase, "allgather_base", opts.timeout, wants_async(opts),
      [output, input](const OpContext& c) {
        run_allgather(c, input.data(), output.data(), input.nbytes());
      },
      {output});
}

WorkPtr GlooBackend::allgather_into_tensor_coalesced(std::vector<Tensor>& outputs,
                                                     std::vector<Tensor>& inputs,
                                                     const pg::AllgatherOptions& opts) {
  return submit(
      OpType::kAllgatherCoalesced, "allgather_into_tensor_coalesced", opts.timeout,
      wants_async(opts),
      [outputs, inputs](const OpContext& c) {
        // One sequence number for the group: the pieces run one after another on every rank,
        // so reusing the tag cannot mix their messages.
        for (size_t i = 0; i < inputs.size(); ++i) {
          run_allgather(c, inputs[i].data(), outputs[i].data(), inputs[i].nbytes());
        }
      },
      outputs);
}

WorkPtr GlooBackend::gather(std::vector<std::vector<Tensor>>& outputs,
                            std::vector<Tensor>& inputs, const pg::GatherOptions& opts) {
  const int root = static_cast<int>(opts.root_rank);
  std::vector<Tensor> gathered = rank() == root ? outputs[0] : std::vector<Tensor>{};
  const Tensor input = inputs[0];
  return submit(
      OpType::kGather, "gather", opts.timeout, wants_async(opts),
      [gathered, input, root](const OpContext& c) {
        const size_t per = input.nbytes();
        if (per == 0) return;
        ::gloo::GatherOptions g(c.context);
        g.setInput(static_cast<char*>(input.data()), per);
        Tensor out;
        if (c.rank == root) {
          out = Tensor::empty({static_cast<int64_t>(per * c.size)}, DType::kUInt8);
          g.setOutput(out.data_as<char>(), per * c.size);
        }
        g.setRoot(root);
        g.setTag(c.tag);
        g.setTimeout(c.timeout);
        ::gloo::gather(g);
        if (c.rank == root) {
          for (int r = 0; r < c.size; ++r) {
            copy_bytes(gathered[r].data(), out.data_as<char>() + r * per, per);
          }
        }
      },
      gathered);
}

WorkPtr GlooBackend::scatter(std::vector<Tensor>& outputs,
                             std::vector<std::vector<Tensor>>& inputs,
                             const pg::ScatterOptions& opts) {
  const int root = static_cast<int>(opts.root_rank);
  std::vector<Tensor> sources = rank() == root ? inputs[0] : std::vector<Tensor>{};
  const Tensor output = outputs[0];
  return submit(
      OpType::kScatter, "scatter", opts.timeout, wants_async(opts),
      [sources, output, root](const OpContext& c) {
        const size_t per = output.nbytes();
        if (per == 0) return;
        ::gloo::ScatterOptions g(c.context);
        if (c.rank == root) {
          std::vector<char*> ptrs;
          for (const Tensor& t : sources) ptrs.push_back(static_cast<char*>(t.data()));
          g.setInputs(ptrs, per);
        }
        g.setOutput(static_cast<char*>(output.data()), per);
        g.setRoot(root);
        g.setTag(c.tag);
        g.setTimeout(c.timeout);
        ::gloo::scatter(g);
      },
      {output});
}

WorkPtr GlooBackend::reduce_scatter(std::vector<Tensor>& outputs,
                                    std::vector<std::vector<Tensor>>& inputs,
                                    const pg::ReduceScatterOptions& opts) {
  const ReduceOp op = opts.reduce_op;
  const Tensor output = outputs[0];
  const std::vector<Tensor> pieces = inputs[0];
  return submit(
      OpType::kReduceScatter, "reduce_scatter", opts.timeout, wants_async(opts),
      [output, pieces, op](const OpContext& c) {
        const int64_t n = output.numel();
        if (n == 0) return;
        Tensor flat = Tensor::empty({n * c.size}, output.dtype());
        for (int r = 0; r < c.size; ++r) {
          copy_bytes(flat.data_as<char>() + r * output.nbytes(), pieces[r].data(),
                     output.nbytes());
        }
        Tensor out = output;
        run_reduce_scatter(c, out, flat, op);
      },
      {output});
}

WorkPtr GlooBackend::reduce_scatter_base(Tensor& output, Tensor& input,
                                         const pg::ReduceScatterOptions& opts) {
  const ReduceOp op = opts.reduce_op;
  return submit(
      OpType::kReduceScatterBase, "reduce_scatter_base", opts.timeout, wants_async(opts),
      [output, input, op](const OpContext& c) {
        Tensor out = output;
        run_reduce_scatter(c, out, input, op);
      },
      {output});
}

WorkPtr GlooBackend::reduce_scatter_tensor_coalesced(std::vector<Tensor>& outputs,
                                                     std::vector<Tensor>& inputs,
                                                     const pg::ReduceScatterOptions& opts) {
  const ReduceOp op = opts.reduce_op;
  return submit(
      OpType::kReduceScatterBase, "reduce_scatter_tensor_coalesced", opts.timeout,
      wants_async(opts),
      [outputs, inputs, op](const OpContext& c) {
        for (size_t i = 0; i < inputs.size(); ++i) {
          Tensor out = outputs[i];
          run_reduce_scatter(c, out, inputs[i], op);
        }
      },
      outputs);
}

WorkPtr GlooBackend::alltoall_base(Tensor& output, Tensor& input,
                                   std::vector<int64_t>& output_split_sizes,
                                   std::vector<int64_t>& input_split_sizes,
                                   const pg::AllToAllOptions& opts) {
  const std::vector<int64_t> out_splits = output_split_sizes;
  const std::vector<int64_t> in_splits = input_split_sizes;
  return submit(
      OpType::kAlltoallBase, "alltoall_base", opts.timeout, wants_async(opts),
      [output, input, out_splits, in_splits](const OpContext& c) {
        if (out_splits.empty() && in_splits.empty()) {
          // Equal splits: every rank exchanges the same number of bytes with every other.
          if (input.nbytes() == 0) return;
          ::gloo::AlltoallOptions g(c.context);
          g.setInput(static_cast<char*>(input.data()), input.nbytes());
          g.setOutput(static_cast<char*>(output.data()), output.nbytes());
          g.setTag(c.tag);
          g.setTimeout(c.timeout);
          ::gloo::alltoall(g);
          return;
        }
        // Split sizes count rows of dimension 0; Gloo wants bytes per rank.
        auto to_bytes = [&c](const Tensor& t, const std::vector<int64_t>& splits) {
          const int64_t rows = t.dim() == 0 ? 1 : t.sizes()[0];
          const int64_t row_bytes =
              rows == 0 ? 0 : static_cast<int64_t>(t.nbytes()) / rows;
          std::vector<int64_t> bytes(c.size);
          for (int r = 0; r < c.size; ++r) {
            bytes[r] = (splits.empty() ? rows / c.size : splits[r]) * row_bytes;
          }
          return bytes;
        };
        run_alltoallv(c, data_or_dummy(input), to_bytes(input, in_splits),
                      data_or_dummy(output), to_bytes(output, out_splits));
      },
      {output});
}

WorkPtr GlooBackend::alltoall(std::vector<Tensor>& outputs, std::vector<Tensor>& inputs,
                              const pg::AllToAllOptions& opts) {
  return submit(
      OpType::kAlltoall, "alltoall", opts.timeout, wants_async(opts),
      [outputs, inputs](const OpContext& c) {
        std::vector<int64_t> in_bytes(c.size), out_bytes(c.size);
        int64_t in_total = 0, out_total = 0;
        for (int r = 0; r < c.size; ++r) {
          in_bytes[r] = static_cast<int64_t>(inputs[r].nbytes());
          out_bytes[r] = static_cast<int64_t>(outputs[r].nbytes());
          in_total += in_bytes[r];
          out_total += out_bytes[r];
        }
        Tensor in = Tensor::empty({std::max<int64_t>(in_total, 1)}, DType::kUInt8);
        Tensor out = Tensor::empty({std::max<int64_t>(out_total, 1)}, DType::kUInt8);
        char* cursor = in.data_as<char>();
        for (int r = 0; r < c.size; ++r) {
          copy_bytes(cursor, inputs[r].data(), in_bytes[r]);
          cursor += in_bytes[r];
        }
        run_alltoallv(c, in.data(), in_bytes, out.data(), out_bytes);
        cursor = out.data_as<char>();
        for (int r = 0; r < c.size; ++r) {
          copy_bytes(outputs[r].data(), cursor, out_bytes[r]);
          cursor += out_bytes[r];
        }
      },
      outputs);
}

WorkPtr GlooBackend::barrier(const pg::BarrierOptions& opts) {
  // A barrier also waits for the asynchronous operations issued before it, as torch's Gloo
  // barrier does: the workers run them concurrently, so they may still be writing their
  // outputs when the ranks meet.
  std::vector<std::weak_ptr<core::Work>> prior;
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    for (const auto& work : shared_->in_flight) prior.push_back(work);
    for (const Task& task : shared_->queue) prior.push_back(task.work);
  }
  return submit(
      OpType::kBarrier, "barrier", opts.timeout, wants_async(opts),
      [prior = std::move(prior)](const OpContext& c) {
        const core::Deadline deadline(c.timeout);
        for (const auto& weak : prior) {
          auto work = weak.lock();
          if (!work) continue;
          // An expired deadline still gets a wait of 1 ms, which fails naming that operation.
          work->wait(deadline.infinite() ? core::kNoTimeout
                                         : std::max(deadline.remaining(), Millis(1)));
        }
        ::gloo::BarrierOptions g(c.context);
        g.setTag(c.tag);
        g.setTimeout(c.timeout);
        ::gloo::barrier(g);
      },
      {});
}

// ---------------------------------------------------------------------------------------------
// Point to point

WorkPtr GlooBackend::send(std::vector<Tensor>& tensors, int dst_rank, int tag) {
  return post_p2p(OpType::kSend, tensors, dst_rank, tag);
}

WorkPtr GlooBackend::recv(std::vector<Tensor>& tensors, int src_rank, int tag) {
  return post_p2p(OpType::kRecv, tensors, src_rank, tag);
}

WorkPtr GlooBackend::recv_anysource(std::vector<Tensor>& tensors, int tag) {
  return post_p2p(OpType::kRecvAnySource, tensors, -1, tag);
}

WorkPtr GlooBackend::post_p2p(OpType type, std::vector<Tensor>& tensors, int peer, int tag) {
  const Tensor tensor = tensors[0];
  // Point-to-point operations do not take a sequence number: the user's tag is the slot, so
  // they match regardless of how collectives interleave with them.
  const auto& context = contexts_[static_cast<uint32_t>(tag) % contexts_.size()];
  const char* what = type == OpType::kSend ? "send" : type == OpType::kRecv ? "recv"
                                                                            : "recv_anysource";
  const std::string between =
      peer < 0 ? str_cat("rank ", rank(), " from any rank")
               : str_cat("rank ", rank(), type == OpType::kSend ? " to" : " from", " rank ", peer);
  std::string description =
      str_cat(what, " (tag ", tag, ", ", between, ", ", tensor.nbytes(), " bytes)");
  // The byte count is part of the slot, so a send meets only a receive of its size. Gloo
  // itself matches by tag alone and then throws on its network thread when a message is larger
  // than the receive buffer, which terminates the process; now the two time out with the usual
  // error instead. Sizes below 16 MiB are in the slot exactly, larger ones folded in.
  uint64_t size_key = tensor.nbytes();
  size_key = (size_key ^ (size_key >> 24) ^ (size_key >> 48)) & 0xFFFFFF;
  const uint64_t slot = (size_key << 32) | static_cast<uint32_t>(tag);
  auto buffer = context->createUnboundBuffer(data_or_dummy(tensor), tensor.nbytes());
  auto* raw = buffer.get();
  auto work = std::make_shared<P2PWork>(type, str_cat("gloo:", what), tensor, std::move(buffer),
                                        resolve_timeout(timeout()), description);
  try {
    if (type == OpType::kSend) {
      raw->send(peer, slot);
    } else if (type == OpType::kRecv) {
      raw->recv(peer, slot);
    } else {
      std::vector<int> sources;
      for (int r = 0; r < size(); ++r) {
        if (r != rank()) sources.push_back(r);
      }
      raw->recv(sources, slot);
    }
  } catch (const std::exception& e) {
    work->finish_with_error(std::make_exception_ptr(
        DistBackendError(str_cat("Gloo ", description, " failed: ", e.what()))));
  }
  return work;
}

// ---------------------------------------------------------------------------------------------
// Monitored barrier

void GlooBackend::monitored_barrier(const pg::BarrierOptions& opts, bool wait_all_ranks) {
  const OpContext c = next_op(opts.timeout);
  if (c.size == 1) return;
  const core::Deadline deadline(c.timeout);
  const uint64_t arrive_slot = (kMonitoredBarrierPrefix << 56) | (uint64_t{c.tag} << 24);
  const uint64_t release_slot = arrive_slot + 1;

  // Waits go through wait_or_abort, so a rank that does not arrive leaves the context usable.
  // A receive given up on is parked rather than destroyed (see parked_).
  auto park = [this](Parked parked) {
    std::lock_guard<std::mutex> lock(parked_mutex_);
    parked_.push_back(std::move(parked));
  };
  if (c.rank != 0) {
    const Millis wait = pg::monitored_barrier_release_wait(timeout(), c.timeout);
    const core::Deadline released_by(wait);
    Parked slot{std::make_unique<char>(1), nullptr};
    slot.buffer = c.context->createUnboundBuffer(slot.byte.get(), 1);
    WaitResult result = WaitResult::kTimedOut;
    try {
      slot.buffer->send(0, arrive_slot);
      result = wait_or_abort(*slot.buffer, true, at_least_1ms(released_by.remaining()));
      if (result == WaitResult::kDone) {
        slot.buffer->recv(0, release_slot);
        result = wait_or_abort(*slot.buffer, false, at_least_1ms(released_by.remaining()));
      }
    } catch (const std::exception& e) {
      throw DistBackendError(str_cat("Rank ", c.rank, " failed in monitored_barrier while "
                                     "talking to rank 0: ", e.what()));
    }
    if (result != WaitResult::kDone) {
      park(std::move(slot));
      throw DistTimeoutError(pg::monitored_barrier_unreleased(c.rank, wait));
    }
    if (*slot.byte != 1) {
      throw DistBackendError(pg::monitored_barrier_others_failed(c.rank, c.timeout));
    }
    return;
  }

  // Rank 0: every other rank must check in before the deadline.
  // A rank that has already exited closed its connection, so posting the receive itself
  // throws: that rank failed the barrier like one that never arrives.
  std::vector<Parked> arrivals(c.size);
  std::vector<std::string> post_errors(c.size);
  for (int r = 1; r < c.size; ++r) {
    arrivals[r].byte = std::make_unique<char>(0);
    arrivals[r].buffer = c.context->createUnboundBuffer(arrivals[r].byte.get(), 1);
    try {
      arrivals[r].buffer->recv(r, arrive_slot);
    } catch (const std::exception& e) {
      post_errors[r] = e.what();
    }
  }
  std::vector<int> arrived, failed;
  std::string first_error;
  for (int r = 1; r < c.size; ++r) {
    // After the first failure without wait_all_ranks, only collect ranks already there.
    const bool give_up = !wait_all_ranks && !failed.empty();
    const Millis limit = give_up ? Millis(1) : at_least_1ms(deadline.remaining());
    std::string error = std::move(post_errors[r]);  // empty: not arrived in time (yet)
    if (error.empty()) {
      try {
        if (wait_or_abort(*arrivals[r].buffer, false, limit) == WaitResult::kDone) {
          arrived.push_back(r);
          continue;
        }
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    if (!give_up) {
      failed.push_back(r);
      if (first_error.empty()) first_error = std::move(error);
    }
    park(std::move(arrivals[r]));
  }
  // Release the ranks that arrived, telling them whether the barrier passed.
  std::vector<char> statuses(c.size, failed.empty() ? 1 : 0);
  std::vector<std::unique_ptr<::gloo::transport::UnboundBuffer>> releases;
  for (int r : arrived) {
    try {
      releases.push_back(c.context->createUnboundBuffer(&statuses[r], 1));
      releases.back()->send(r, release_slot);
    } catch (const std::exception&) {
      releases.pop_back();
    }
  }
  for (auto& release : releases) {
    try {
      (void)wait_or_abort(*release, true, Millis(1000));
    } catch (const std::exception&) {
      // A rank that went away after arriving finds out on its own.
    }
  }
  if (failed.empty()) return;
  // A rank that arrives after rank 0 gave up on it finds this verdict waiting instead of
  // waiting out its own timeout (the send stays parked until it does).
  for (int r : failed) {
    Parked verdict{std::make_unique<char>(0), nullptr};
    try {
      verdict.buffer = c.context->createUnboundBuffer(verdict.byte.get(), 1);
      verdict.buffer->send(r, release_slot);
    } catch (const std::exception&) {
      continue;  // gone: nobody to tell
    }
    park(std::move(verdict));
  }
  const std::string message = pg::monitored_barrier_missing(failed, c.timeout);
  if (!first_error.empty()) throw DistBackendError(str_cat(message, ": ", first_error));
  throw DistTimeoutError(message);
}

}  // namespace c10d::backends::gloo
