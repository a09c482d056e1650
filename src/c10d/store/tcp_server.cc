#include "c10d/store/tcp_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <random>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "c10d/core/exception.h"
#include "c10d/store/wire.h"

namespace c10d::store {
namespace {

using core::detail::str_cat;
using wire::QueryType;
using wire::Request;
using wire::RequestParser;

constexpr size_t kReadBufferSize = 64 * 1024;
// The largest reply one request may make the server build (a MULTI_GET or LIST_KEYS past it
// drops that client): 4 full values, so no single request holds the loop for long.
constexpr size_t kMaxReplyBytes = 4 * wire::kMaxValueLen;
// A client whose unsent replies reach this many bytes is not read from (nor are its buffered
// requests handled) until they drain: pipelined requests whose replies are never read cannot
// grow the server past this plus one reply.
constexpr size_t kMaxPendingBytes = 4 * 1024 * 1024;
// Attempts to listen when the port is in use (see Impl::try_listen).
constexpr int kListenAttempts = 4;

std::string uv_error_text(int err) {
  // libuv reports negated errno values on Unix; strerror gives the familiar wording.
  return str_cat(std::strerror(-err), " (", uv_err_name(err), ")");
}

int listen_backlog() {
  std::ifstream in("/proc/sys/net/core/somaxconn");
  int value = 0;
  if (in >> value && value > 0) return value;
  return SOMAXCONN;
}

std::string format_address(const sockaddr_storage& addr) {
  char ip[INET6_ADDRSTRLEN] = "?";
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    uv_ip4_name(a, ip, sizeof ip);
    return str_cat(ip, ":", ntohs(a->sin_port));
  }
  if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    uv_ip6_name(a, ip, sizeof ip);
    return str_cat("[", ip, "]:", ntohs(a->sin6_port));
  }
  return "?";
}

bool parse_int64(const Bytes& value, int64_t& out) {
  const char* first = reinterpret_cast<const char*>(value.data());
  const char* last = first + value.size();
  auto [ptr, ec] = std::from_chars(first, last, out);
  return !value.empty() && ec == std::errc() && ptr == last;
}

Bytes decimal(int64_t v) { return to_bytes(std::to_string(v)); }

// An owned reply buffer in flight inside libuv.
struct WriteReq {
  uv_write_t req;
  std::string data;
};

}  // namespace

class TCPServer::Impl {
 public:
  explicit Impl(const TCPServerOptions& options);
  ~Impl();

  uint16_t port() const { return port_; }

 private:
  struct PendingWait {
    size_t remaining;               // keys still missing
    std::vector<std::string> keys;  // the keys it is registered under in waiters_
  };
  // One connection. Lives from accept until libuv's close callback; `handle` must stay first
  // so the handle pointer libuv gives back can be turned into the Client.
  struct Client {
    uv_tcp_t handle;
    uint64_t id = 0;
    std::string peer;
    RequestParser parser;
    bool validated = false;
    bool authenticated = false;
    bool closing = false;
    bool paused = false;  // not read from until its replies drain (kMaxPendingBytes)
    std::string out;      // replies not yet handed to libuv
    std::unordered_map<uint64_t, PendingWait> waits;  // by wait id
    std::vector<std::string> barrier_keys;            // keys with a BARRIER of ours pending
  };
  struct WaiterRef {
    uint64_t client;
    uint64_t wait;
  };
  struct BarrierWaiter {
    uint64_t client;
    int64_t world_size;
  };

  // Setup and teardown (constructor thread, before the loop thread exists, or loop thread).
  [[nodiscard]] int try_listen(const sockaddr* addr, int backlog);
  [[nodiscard]] int adopt_fd(int fd, int backlog);
  void close_all_handles();
  void run();

  // libuv callbacks.
  static void on_stop(uv_async_t* handle);
  static void on_connection(uv_stream_t* server, int status);
  static void on_alloc(uv_handle_t* handle, size_t suggested, uv_buf_t* buf);
  static void on_read(uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf);
  static void on_write(uv_write_t* req, int status);
  static void on_client_closed(uv_handle_t* handle);

  // Protocol handling; every function below runs on the loop thread only.
  void process(Client* c);
  // Returns false when the request was invalid and the client has been dropped.
  bool handle(Client* c, Request& r);
  void flush(Client* c);
  // Bytes of replies to `c` not yet taken by the kernel.
  size_t pending(Client* c) const;
  // Size of the MULTI_GET reply for `keys`, or of the LIST_KEYS reply (no keys).
  size_t reply_size(const std::vector<std::string>& keys) const;
  size_t list_keys_size() const;
  void drop(Client* c, const std::string& reason);
  void forget_waits(Client* c);

  bool present(const std::string& key) const;
  void wait_for(Client* c, const std::vector<std::string>& keys);
  // Every write wakes all waiters on the key (and releases barriers on it).
  void after_write(const std::string& key);
  // QUEUE_PUSH wakes one waiter only: one pushed item can satisfy one popper.
  void wake_one(const std::string& key);
  bool satisfy(const WaiterRef& ref);
  void release_barriers(const std::string& key);
  bool add(Client* c, const std::string& key, int64_t delta, int64_t& result);

  void log(const std::string& line) const {
    std::fprintf(stderr, "[c10d TCPServer :%u] %s\n", port_, line.c_str());
  }

  uv_loop_t loop_{};
  uv_tcp_t listener_{};
  uv_async_t stop_{};
  std::thread thread_;
  uint16_t port_ = 0;
  char read_buffer_[kReadBufferSize];  // shared by every client: reads are consumed at once

  uint64_t next_client_id_ = 0;
  uint64_t next_wait_id_ = 0;
  std::unordered_map<uint64_t, Client*> clients_;
  const std::optional<std::string> secret_;
  std::unordered_map<std::string, Bytes> data_;
  std::unordered_map<std::string, std::deque<Bytes>> queues_;
  std::unordered_map<std::string, std::deque<WaiterRef>> waiters_;
  std::unordered_map<std::string, std::vector<BarrierWaiter>> barriers_;
};

TCPServer::Impl::Impl(const TCPServerOptions& options) : secret_(options.secret) {
  int rc = uv_loop_init(&loop_);
  C10D_CHECK_T(core::DistNetworkError, rc == 0,
               "TCPServer: uv_loop_init failed: ", uv_error_text(rc));
  loop_.data = this;
  uv_async_init(&loop_, &stop_, &Impl::on_stop);
  stop_.data = this;

  const int backlog = listen_backlog();
  std::string where;
  if (options.listen_fd) {
    where = str_cat("listen fd ", *options.listen_fd);
    rc = adopt_fd(*options.listen_fd, backlog);
  } else if (options.host && !options.host->empty()) {
    where = str_cat(*options.host, ":", options.port);
    sockaddr_storage addr{};
    if (uv_ip4_addr(options.host->c_str(), options.port, reinterpret_cast<sockaddr_in*>(&addr)) ==
            0 ||
        uv_ip6_addr(options.host->c_str(), options.port, reinterpret_cast<sockaddr_in6*>(&addr)) ==
            0) {
      rc = try_listen(reinterpret_cast<sockaddr*>(&addr), backlog);
    } else {
      addrinfo hints{};
      hints.ai_socktype = SOCK_STREAM;
      addrinfo* list = nullptr;
      rc = UV_EADDRNOTAVAIL;
      if (::getaddrinfo(options.host->c_str(), nullptr, &hints, &list) == 0) {
        for (addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
          if (ai->ai_family == AF_INET) {
            reinterpret_cast<sockaddr_in*>(ai->ai_addr)->sin_port = htons(options.port);
          } else if (ai->ai_family == AF_INET6) {
            reinterpret_cast<sockaddr_in6*>(ai->ai_addr)->sin6_port = htons(options.port);
          } else {
            continue;
          }
          rc = try_listen(ai->ai_addr, backlog);
          if (rc == 0) break;
        }
        ::freeaddrinfo(list);
      }
    }
  } else {
    sockaddr_in6 any6{};
    uv_ip6_addr("::", options.port, &any6);
    where = str_cat("[::]:", options.port);
    rc = try_listen(reinterpret_cast<sockaddr*>(&any6), backlog);
    if (rc != 0 && rc != UV_EADDRINUSE && rc != UV_EACCES) {
      // No IPv6 on this host: serve IPv4 only.
      sockaddr_in any4{};
      uv_ip4_addr("0.0.0.0", options.port, &any4);
      where = str_cat("0.0.0.0:", options.port);
      rc = try_listen(reinterpret_cast<sockaddr*>(&any4), backlog);
    }
  }
  if (rc != 0) {
    close_all_handles();
    uv_run(&loop_, UV_RUN_DEFAULT);
    uv_loop_close(&loop_);
    throw core::DistNetworkError(
        str_cat("The server socket has failed to listen on any local network address: "
                "TCPServer cannot listen on ",
                where, ": ", uv_error_text(rc)));
  }

  sockaddr_storage bound{};
  int len = sizeof bound;
  uv_tcp_getsockname(&listener_, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                      : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);

  // The handles are set up; from here on only the loop thread touches them.
  thread_ = std::thread([this] { run(); });
}

TCPServer::Impl::~Impl() {
  uv_async_send(&stop_);
  thread_.join();
  if (uv_loop_close(&loop_) != 0) {
    // Should not happen (every handle is closed by on_stop); run once more to finish closing.
    uv_run(&loop_, UV_RUN_DEFAULT);
    uv_loop_close(&loop_);
  }
}

int TCPServer::Impl::try_listen(const sockaddr* addr, int backlog) {
  // Two servers that bind one port at the same moment can both fail: libuv sets SO_REUSEADDR,
  // so both binds succeed, and then each listen fails with EADDRINUSE because of the other
  // (two launchers racing to host a rendezvous store both became clients and waited for a
  // server). Retrying after a random pause breaks the tie: whoever listens first keeps the
  // port, and the other keeps failing. A port that is simply taken costs ~30 ms more.
  std::minstd_rand random(std::random_device{}());
  for (int attempt = 1;; ++attempt) {
    uv_tcp_init(&loop_, &listener_);
    listener_.data = this;
    int rc = uv_tcp_bind(&listener_, addr, 0);
    if (rc == 0)
      rc = uv_listen(reinterpret_cast<uv_stream_t*>(&listener_), backlog, &Impl::on_connection);
    if (rc == 0) return 0;
    uv_close(reinterpret_cast<uv_handle_t*>(&listener_), nullptr);
    uv_run(&loop_, UV_RUN_NOWAIT);  // completes the close so the handle can be reused
    if (rc != UV_EADDRINUSE || attempt == kListenAttempts) return rc;
    std::this_thread::sleep_for(std::chrono::microseconds(1000 + random() % 10000));
  }
}

int TCPServer::Impl::adopt_fd(int fd, int backlog) {
  int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (copy < 0) return -errno;
  uv_tcp_init(&loop_, &listener_);
  listener_.data = this;
  int rc = uv_tcp_open(&listener_, copy);
  if (rc != 0) {
    ::close(copy);
  } else {
    rc = uv_listen(reinterpret_cast<uv_stream_t*>(&listener_), backlog, &Impl::on_connection);
  }
  if (rc != 0) {
    uv_close(reinterpret_cast<uv_handle_t*>(&listener_), nullptr);
    uv_run(&loop_, UV_RUN_NOWAIT);
  }
  return rc;
}

void TCPServer::Impl::run() {
  // libuv writes with write(2): a peer that vanished would raise SIGPIPE and kill the
  // process. Blocking it on this thread alone turns that into an EPIPE error for the write
  // without changing the process's signal disposition.
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
  uv_run(&loop_, UV_RUN_DEFAULT);
  // uv_run returns once on_stop has closed every handle.
}

void TCPServer::Impl::close_all_handles() {
  uv_walk(
      &loop_,
      [](uv_handle_t* h, void* arg) {
        if (uv_is_closing(h)) return;
        // The listener and the async handle carry the Impl; everything else is a Client.
        uv_close(h, h->data == arg ? nullptr : &Impl::on_client_closed);
      },
      this);
}

void TCPServer::Impl::on_stop(uv_async_t* handle) {
  auto* self = static_cast<Impl*>(handle->data);
  for (auto& [id, c] : self->clients_) c->closing = true;
  self->clients_.clear();
  self->waiters_.clear();
  self->barriers_.clear();
  self->close_all_handles();
}

void TCPServer::Impl::on_connection(uv_stream_t* server, int status) {
  auto* self = static_cast<Impl*>(server->data);
  if (status < 0) {
    self->log(str_cat("accept failed: ", uv_error_text(status)));
    return;
  }
  auto* c = new Client;
  uv_tcp_init(&self->loop_, &c->handle);
  c->handle.data = c;
  if (int rc = uv_accept(server, reinterpret_cast<uv_stream_t*>(&c->handle)); rc != 0) {
    self->log(str_cat("accept failed: ", uv_error_text(rc)));
    uv_close(reinterpret_cast<uv_handle_t*>(&c->handle), &Impl::on_client_closed);
    return;
  }
  uv_tcp_nodelay(&c->handle, 1);
  sockaddr_storage peer{};
  int len = sizeof peer;
  if (uv_tcp_getpeername(&c->handle, reinterpret_cast<sockaddr*>(&peer), &len) == 0) {
    c->peer = format_address(peer);
  }
  c->id = ++self->next_client_id_;
  self->clients_.emplace(c->id, c);
  uv_read_start(reinterpret_cast<uv_stream_t*>(&c->handle), &Impl::on_alloc, &Impl::on_read);
}

void TCPServer::Impl::on_alloc(uv_handle_t* handle, size_t, uv_buf_t* buf) {
  auto* self = static_cast<Impl*>(handle->loop->data);
  *buf = uv_buf_init(self->read_buffer_, sizeof self->read_buffer_);
}

void TCPServer::Impl::on_read(uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf) {
  auto* c = static_cast<Client*>(stream->data);
  auto* self = static_cast<Impl*>(stream->loop->data);
  if (c->closing) return;
  if (nread > 0) {
    c->parser.feed(buf->base, static_cast<size_t>(nread));
    self->process(c);
    return;
  }
  if (nread == 0) return;  // EAGAIN
  if (c->parser.mid_request()) {
    self->drop(c, str_cat("disconnected in the middle of a request (",
                          nread == UV_EOF ? "end of stream" : uv_error_text(nread), ")"));
  } else {
    self->drop(c, "");  // an ordinary disconnect between requests
  }
}

void TCPServer::Impl::on_write(uv_write_t* req, int status) {
  auto* w = reinterpret_cast<WriteReq*>(req);
  auto* c = static_cast<Client*>(req->handle->data);
  auto* self = static_cast<Impl*>(req->handle->loop->data);
  delete w;
  if (status < 0) {
    if (status != UV_ECANCELED) self->drop(c, str_cat("write failed: ", uv_error_text(status)));
    return;
  }
  if (c->paused && !c->closing && self->pending(c) < kMaxPendingBytes / 2) {
    c->paused = false;
    uv_read_start(reinterpret_cast<uv_stream_t*>(&c->handle), &Impl::on_alloc, &Impl::on_read);
    self->process(c);  // the requests already buffered
  }
}

void TCPServer::Impl::on_client_closed(uv_handle_t* handle) {
  delete reinterpret_cast<Client*>(handle);
}

void TCPServer::Impl::drop(Client* c, const std::string& reason) {
  if (c->closing) return;
  c->closing = true;
  if (!reason.empty()) log(str_cat("dropping client ", c->peer, ": ", reason));
  forget_waits(c);
  clients_.erase(c->id);
  uv_close(reinterpret_cast<uv_handle_t*>(&c->handle), &Impl::on_client_closed);
}

size_t TCPServer::Impl::pending(Client* c) const {
  return c->out.size() +
         uv_stream_get_write_queue_size(reinterpret_cast<const uv_stream_t*>(&c->handle));
}

size_t TCPServer::Impl::reply_size(const std::vector<std::string>& keys) const {
  size_t total = 0;
  for (const auto& key : keys) {
    auto it = data_.find(key);
    total += sizeof(uint64_t) + (it == data_.end() ? 0 : it->second.size());
  }
  return total;
}

size_t TCPServer::Impl::list_keys_size() const {
  size_t total = sizeof(int64_t);
  for (const auto& [key, value] : data_) total += sizeof(uint64_t) + key.size();
  return total;
}

void TCPServer::Impl::flush(Client* c) {
  if (c->out.empty() || c->closing) return;
  auto* stream = reinterpret_cast<uv_stream_t*>(&c->handle);
  uv_buf_t buf = uv_buf_init(c->out.data(), static_cast<unsigned>(c->out.size()));
  // Write directly when the socket takes it all (the common case); libuv keeps ordering by
  // refusing try_write while queued writes are pending.
  int n = uv_try_write(stream, &buf, 1);
  if (n == static_cast<int>(c->out.size())) {
    c->out.clear();
    return;
  }
  if (n < 0 && n != UV_EAGAIN) {
    drop(c, str_cat("write failed: ", uv_error_text(n)));
    return;
  }
  auto* w = new WriteReq;
  w->data.assign(c->out, n > 0 ? static_cast<size_t>(n) : 0);
  c->out.clear();
  buf = uv_buf_init(w->data.data(), static_cast<unsigned>(w->data.size()));
  if (int rc = uv_write(&w->req, stream, &buf, 1, &Impl::on_write); rc != 0) {
    delete w;
    drop(c, str_cat("write failed: ", uv_error_text(rc)));
  }
}

void TCPServer::Impl::process(Client* c) {
  Request r;
  while (!c->closing && !c->paused) {
    if (pending(c) >= kMaxPendingBytes) {
      flush(c);
      if (c->closing || pending(c) >= kMaxPendingBytes) {
        // Replies wait for the client to read them; on_write resumes it once they drained.
        c->paused = true;
        uv_read_stop(reinterpret_cast<uv_stream_t*>(&c->handle));
        return;
      }
    }
    switch (c->parser.next(r)) {
      case RequestParser::Status::kNeedMore:
        flush(c);
        return;
      case RequestParser::Status::kError:
        drop(c, c->parser.error());
        return;
      case RequestParser::Status::kRequest:
        if (!handle(c, r)) return;
        break;
    }
  }
}

bool TCPServer::Impl::present(const std::string& key) const {
  if (data_.count(key) != 0) return true;
  auto q = queues_.find(key);
  return q != queues_.end() && !q->second.empty();
}

void TCPServer::Impl::wait_for(Client* c, const std::vector<std::string>& keys) {
  std::vector<std::string> missing;
  std::unordered_set<std::string_view> seen;
  for (const auto& key : keys) {
    if (!present(key) && seen.insert(key).second) missing.push_back(key);
  }
  if (missing.empty()) {
    c->out.push_back(static_cast<char>(wire::WaitReply::kStopWaiting));
    return;
  }
  uint64_t wait_id = ++next_wait_id_;
  for (const auto& key : missing) waiters_[key].push_back({c->id, wait_id});
  c->waits.emplace(wait_id, PendingWait{missing.size(), std::move(missing)});
}

bool TCPServer::Impl::satisfy(const WaiterRef& ref) {
  auto ci = clients_.find(ref.client);
  if (ci == clients_.end()) return false;
  Client* c = ci->second;
  auto wi = c->waits.find(ref.wait);
  if (wi == c->waits.end()) return false;
  if (--wi->second.remaining == 0) {
    c->waits.erase(wi);
    c->out.push_back(static_cast<char>(wire::WaitReply::kStopWaiting));
    flush(c);
  }
  return true;
}

void TCPServer::Impl::after_write(const std::string& key) {
  if (auto it = waiters_.find(key); it != waiters_.end()) {
    std::deque<WaiterRef> list = std::move(it->second);
    waiters_.erase(it);
    for (const auto& ref : list) satisfy(ref);
  }
  if (barriers_.count(key) != 0) release_barriers(key);
}

void TCPServer::Impl::wake_one(const std::string& key) {
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  auto& list = it->second;
  while (!list.empty()) {
    WaiterRef ref = list.front();
    list.pop_front();
    if (satisfy(ref)) break;
  }
  if (list.empty()) waiters_.erase(it);
}

void TCPServer::Impl::release_barriers(const std::string& key) {
  auto it = barriers_.find(key);
  auto value = data_.find(key);
  int64_t count = 0;
  if (it == barriers_.end() || value == data_.end() || !parse_int64(value->second, count)) {
    return;
  }
  auto& list = it->second;
  std::vector<uint64_t> released;
  list.erase(std::remove_if(list.begin(), list.end(),
                            [&](const BarrierWaiter& w) {
                              if (w.world_size > count) return false;
                              released.push_back(w.client);
                              return true;
                            }),
             list.end());
  if (list.empty()) barriers_.erase(it);
  for (uint64_t id : released) {
    auto ci = clients_.find(id);
    if (ci == clients_.end()) continue;
    Client* c = ci->second;
    auto& keys = c->barrier_keys;
    if (auto k = std::find(keys.begin(), keys.end(), key); k != keys.end()) keys.erase(k);
    c->out.push_back(static_cast<char>(wire::WaitReply::kStopWaiting));
    flush(c);
  }
}

void TCPServer::Impl::forget_waits(Client* c) {
  for (auto& [wait_id, wait] : c->waits) {
    for (const auto& key : wait.keys) {
      auto it = waiters_.find(key);
      if (it == waiters_.end()) continue;
      auto& list = it->second;
      list.erase(std::remove_if(list.begin(), list.end(),
                                [&](const WaiterRef& r) { return r.client == c->id; }),
                 list.end());
      if (list.empty()) waiters_.erase(it);
    }
  }
  c->waits.clear();
  for (const auto& key : c->barrier_keys) {
    auto it = barriers_.find(key);
    if (it == barriers_.end()) continue;
    auto& list = it->second;
    list.erase(std::remove_if(list.begin(), list.end(),
                              [&](const BarrierWaiter& w) { return w.client == c->id; }),
               list.end());
    if (list.empty()) barriers_.erase(it);
  }
  c->barrier_keys.clear();
}

bool TCPServer::Impl::add(Client* c, const std::string& key, int64_t delta, int64_t& result) {
  auto it = data_.find(key);
  int64_t current = 0;
  if (it != data_.end() && !parse_int64(it->second, current)) {
    drop(c, str_cat("ADD on key '", key, "' whose value is not an integer"));
    return false;
  }
  result = current + delta;
  if (it == data_.end()) {
    data_.emplace(key, decimal(result));
  } else {
    it->second = decimal(result);
  }
  return true;
}

bool TCPServer::Impl::handle(Client* c, Request& r) {
  wire::Encoder reply;
  if (!c->validated) {
    if (r.type != QueryType::kValidate) {
      drop(c, str_cat("first request is ", wire::query_name(static_cast<uint8_t>(r.type)),
                      ", not VALIDATE"));
      return false;
    }
  }
  if (secret_ && !c->authenticated && r.type != QueryType::kValidate &&
      r.type != QueryType::kAuth) {
    drop(c, str_cat(wire::query_name(static_cast<uint8_t>(r.type)),
                    " before AUTH: this server requires a shared secret"));
    return false;
  }
  switch (r.type) {
    case QueryType::kAuth: {
      // Constant-time comparison, so the reply time does not leak the secret.
      // A server without a secret accepts any AUTH.
      const Bytes& given = r.values[0];
      bool ok = true;
      if (secret_) {
        const std::string& want = *secret_;
        uint8_t diff = given.size() == want.size() ? 0 : 1;
        const size_t n = std::min(given.size(), want.size());
        for (size_t i = 0; i < n; ++i) diff |= given[i] ^ static_cast<uint8_t>(want[i]);
        ok = diff == 0;
      }
      if (!ok) {
        drop(c, "wrong shared secret");
        return false;
      }
      c->authenticated = true;
      reply.u8(1);
      break;
    }
    case QueryType::kValidate:
      if (r.u32 != wire::kValidationMagic) {
        char hex[16];
        std::snprintf(hex, sizeof hex, "0x%08X", r.u32);
        drop(c, str_cat("bad validation magic ", hex));
        return false;
      }
      c->validated = true;
      return true;
    case QueryType::kPing:
      reply.u32(r.u32);
      break;
    case QueryType::kSet:
      data_[r.keys[0]] = std::move(r.values[0]);
      after_write(r.keys[0]);
      return true;
    case QueryType::kCompareSet: {
      const std::string& key = r.keys[0];
      Bytes& expected = r.values[0];
      Bytes& desired = r.values[1];
      auto it = data_.find(key);
      if (it == data_.end()) {
        if (expected.empty()) {
          reply.bytes(desired);
          data_.emplace(key, std::move(desired));
          after_write(key);
        } else {
          reply.bytes(expected);
        }
      } else if (it->second == expected) {
        it->second = std::move(desired);
        reply.bytes(it->second);
        after_write(key);
      } else {
        reply.bytes(it->second);
      }
      break;
    }
    case QueryType::kGet: {
      auto it = data_.find(r.keys[0]);
      reply.bytes(it == data_.end() ? Bytes{} : it->second);
      break;
    }
    case QueryType::kAdd: {
      int64_t result = 0;
      if (!add(c, r.keys[0], r.integer, result)) return false;
      reply.i64(result);
      c->out += reply.buffer();
      after_write(r.keys[0]);
      return true;
    }
    case QueryType::kCheck: {
      bool ready = std::all_of(r.keys.begin(), r.keys.end(),
                               [&](const std::string& k) { return present(k); });
      reply.u8(
          static_cast<uint8_t>(ready ? wire::CheckReply::kReady : wire::CheckReply::kNotReady));
      break;
    }
    case QueryType::kWait:
      wait_for(c, r.keys);
      return true;
    case QueryType::kGetNumKeys:
      reply.i64(static_cast<int64_t>(data_.size()));
      break;
    case QueryType::kDeleteKey:
      reply.i64(static_cast<int64_t>(data_.erase(r.keys[0])));
      break;
    case QueryType::kAppend: {
      Bytes& value = data_[r.keys[0]];
      // Appends obey the value limit too, so no sequence of requests grows one value past it.
      if (value.size() + r.values[0].size() > wire::kMaxValueLen) {
        drop(c, str_cat("APPEND would grow key '", r.keys[0], "' to ",
                        value.size() + r.values[0].size(), " bytes, past the limit of ",
                        wire::kMaxValueLen));
        return false;
      }
      value.insert(value.end(), r.values[0].begin(), r.values[0].end());
      after_write(r.keys[0]);
      return true;
    }
    case QueryType::kMultiGet:
      if (size_t size = reply_size(r.keys); size > kMaxReplyBytes) {
        drop(c, str_cat("MULTI_GET of ", r.keys.size(), " keys would need a reply of ", size,
                        " bytes, past the limit of ", kMaxReplyBytes));
        return false;
      }
      for (const auto& key : r.keys) {
        auto it = data_.find(key);
        reply.bytes(it == data_.end() ? Bytes{} : it->second);
      }
      break;
    case QueryType::kMultiSet:
      for (size_t i = 0; i < r.keys.size(); ++i) {
        data_[r.keys[i]] = std::move(r.values[i]);
        after_write(r.keys[i]);
      }
      return true;
    case QueryType::kCancelWait:
      forget_waits(c);
      reply.u8(static_cast<uint8_t>(wire::WaitReply::kWaitCanceled));
      break;
    case QueryType::kQueuePush:
      queues_[r.keys[0]].push_back(std::move(r.values[0]));
      wake_one(r.keys[0]);
      return true;
    case QueryType::kQueuePop: {
      auto it = queues_.find(r.keys[0]);
      if (it == queues_.end() || it->second.empty()) {
        reply.i64(0);
      } else {
        reply.i64(static_cast<int64_t>(it->second.size()));
        reply.bytes(it->second.front());
        it->second.pop_front();
        if (it->second.empty()) queues_.erase(it);
      }
      break;
    }
    case QueryType::kQueueLen: {
      auto it = queues_.find(r.keys[0]);
      reply.i64(it == queues_.end() ? 0 : static_cast<int64_t>(it->second.size()));
      break;
    }
    case QueryType::kListKeys:
      if (size_t size = list_keys_size(); size > kMaxReplyBytes) {
        drop(c, str_cat("LIST_KEYS of ", data_.size(), " keys would need a reply of ", size,
                        " bytes, past the limit of ", kMaxReplyBytes));
        return false;
      }
      reply.i64(static_cast<int64_t>(data_.size()));
      for (const auto& [key, value] : data_) reply.str(key);
      break;
    case QueryType::kBarrier: {
      const std::string& key = r.keys[0];
      int64_t count = 0;
      if (!add(c, key, 1, count)) return false;
      if (count >= r.integer) {
        c->out.push_back(static_cast<char>(wire::WaitReply::kStopWaiting));
      } else {
        barriers_[key].push_back({c->id, r.integer});
        c->barrier_keys.push_back(key);
      }
      after_write(key);
      return true;
    }
  }
  c->out += reply.buffer();
  return true;
}

TCPServer::TCPServer(const TCPServerOptions& options) : impl_(std::make_unique<Impl>(options)) {}

TCPServer::~TCPServer() = default;

uint16_t TCPServer::port() const { return impl_->port(); }

}  // namespace c10d::store
