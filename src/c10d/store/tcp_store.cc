#include "c10d/store/tcp_store.h"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <random>
#include <thread>

#include "c10d/core/env.h"
#include "c10d/core/exception.h"
#include "c10d/store/tcp_server.h"
#include "c10d/store/wire.h"

namespace c10d::store {
namespace {

using core::Deadline;
using core::detail::str_cat;
using wire::QueryType;

// The key PyTorch's clients use to count registered workers; sent without the "/" prefix.
constexpr const char* kInitKey = "init/";
constexpr const char* kKeyPrefix = "/";

constexpr Millis kFirstBackoff{20};
constexpr Millis kMaxBackoff{1000};
// Connections a server may drop during the handshake, in a row, before the client gives up
// (TCPStore::open_connection).
constexpr int kHandshakeDrops = 3;

std::string endpoint(const std::string& host, uint16_t port) {
  if (host.find(':') != std::string::npos) return str_cat("[", host, "]:", port);
  return str_cat(host, ":", port);
}

// "2" for 2000 ms, "0.5" for 500 ms: the N of "Timed out after N seconds".
std::string seconds_text(Millis timeout) {
  if (timeout.count() % 1000 == 0) return std::to_string(timeout.count() / 1000);
  std::string s = std::to_string(timeout.count() / 1000.0);
  s.erase(s.find_last_not_of('0') + 1);
  return s;
}

// Process-wide registry of servers shared by multi_tenant stores, keyed by (host, port).
struct ServerRegistry {
  std::mutex mu;
  std::map<std::pair<std::string, uint16_t>, std::weak_ptr<TCPServer>> servers;  // GUARDED_BY(mu)

  static ServerRegistry& instance() {
    static auto* registry = new ServerRegistry;  // never destroyed: usable during exit
    return *registry;
  }
};

std::optional<std::string> default_secret() {
  if (!core::env_is_set(core::kEnvStoreSecret)) return std::nullopt;
  return core::env_string(core::kEnvStoreSecret);
}

uint64_t default_max_reply() {
  const int64_t bytes = core::env_int(core::kEnvStoreMaxReplyBytes);
  C10D_CHECK_ARG(bytes > 0, core::kEnvStoreMaxReplyBytes.name, " must be positive, got ", bytes);
  return static_cast<uint64_t>(bytes);
}

std::shared_ptr<TCPServer> start_server(const std::string& host, const TCPStoreOptions& opts) {
  TCPServerOptions server_opts;
  server_opts.port = opts.port;
  server_opts.listen_fd = opts.master_listen_fd;
  server_opts.secret = opts.secret ? opts.secret : default_secret();
  if (!opts.multi_tenant) return std::make_shared<TCPServer>(server_opts);

  auto& registry = ServerRegistry::instance();
  std::lock_guard<std::mutex> lock(registry.mu);
  if (opts.port != 0) {
    auto it = registry.servers.find({host, opts.port});
    if (it != registry.servers.end()) {
      if (auto server = it->second.lock()) return server;
    }
  }
  auto server = std::make_shared<TCPServer>(server_opts);
  registry.servers[{host, server->port()}] = server;
  return server;
}

// Prefixes a user key and checks it against the protocol limit; `context` starts the error.
std::string wire_key(const std::string& context, const std::string& user_key) {
  if (user_key.size() + 1 > wire::kMaxKeyLen) {
    throw core::InvalidArgument(str_cat(context, "key of ", user_key.size(),
                                        " bytes exceeds the limit of ", wire::kMaxKeyLen - 1,
                                        " bytes"));
  }
  std::string k;
  k.reserve(user_key.size() + 1);
  k += kKeyPrefix;
  k += user_key;
  return k;
}

std::vector<std::string> wire_keys(const std::string& context,
                                   const std::vector<std::string>& user_keys) {
  if (user_keys.size() > wire::kMaxKeysPerOp) {
    throw core::InvalidArgument(str_cat(context, user_keys.size(), " keys exceed the limit of ",
                                        wire::kMaxKeysPerOp, " keys per operation"));
  }
  std::vector<std::string> keys;
  keys.reserve(user_keys.size());
  for (const auto& k : user_keys) keys.push_back(wire_key(context, k));
  return keys;
}

}  // namespace

// One request/reply exchange: holds the connection's mutex, encodes the request, reads the
// reply with the store timeout as deadline, and turns socket failures into errors that name
// the store and the operation. A failure other than a cancelled wait marks the connection
// unusable, because the reply stream may be out of step with the requests.
class TCPStore::Call {
 public:
  // A call on the main connection; holds its mutex until destroyed.
  Call(TCPStore& store, const char* op)
      : store_(store), op_(op), lock_(store.mu_), socket_(&store.socket_),
        deadline_(store.timeout()) {
    check_usable();
  }
  // A call on a connection the caller owns exclusively (a wait connection).
  Call(TCPStore& store, const char* op, net::Socket& socket)
      : store_(store), op_(op), socket_(&socket), deadline_(store.timeout()) {
    check_usable();
  }

  std::string prefix() const { return str_cat(store_.describe(), ": ", op_, ": "); }
  const Deadline& deadline() const { return deadline_; }

  void check_usable() {
    if (!store_.is_broken_.load(std::memory_order_acquire) && socket_->valid()) return;
    throw core::DistNetworkError(str_cat(
        prefix(), "the connection to the store server at ", endpoint(store_.host_, store_.port_),
        " is unusable after an earlier error: ", store_.broken_reason()));
  }

  wire::Encoder& request() { return request_; }

  std::string key(const std::string& user_key) const { return wire_key(prefix(), user_key); }
  void check_value(const Bytes& value) const {
    if (value.size() > wire::kMaxValueLen) {
      throw core::InvalidArgument(str_cat(prefix(), "value of ", value.size(),
                                          " bytes exceeds the limit of ", wire::kMaxValueLen,
                                          " bytes"));
    }
  }
  void check_count(size_t n) const {
    if (n > wire::kMaxKeysPerOp) {
      throw core::InvalidArgument(str_cat(prefix(), n, " keys exceed the limit of ",
                                          wire::kMaxKeysPerOp, " keys per operation"));
    }
  }
  void keys(const std::vector<std::string>& user_keys) {
    check_count(user_keys.size());
    request_.u64(user_keys.size());
    for (const auto& k : user_keys) request_.str(key(k));
  }

  void send() {
    guarded(
        [&] { socket_->send_all(request_.buffer().data(), request_.buffer().size(), deadline_); });
    request_.clear();
  }

  bool readable(const Deadline& deadline) {
    return guarded([&] { return socket_->wait_readable(deadline); });
  }
  uint8_t u8() { return read<uint8_t>(); }
  uint32_t u32() { return read<uint32_t>(); }
  int64_t i64() { return read<int64_t>(); }
  Bytes bytes() {
    const auto size = read<uint64_t>();
    if (size > store_.max_reply_bytes_) {
      protocol_error(str_cat("value length ", size, " (past the client's limit of ",
                             store_.max_reply_bytes_, " bytes, ", core::kEnvStoreMaxReplyBytes.name,
                             ")"));
    }
    // Grown as the bytes arrive, so a length the server never sends costs no memory.
    constexpr size_t kChunk = size_t{1} << 20;
    Bytes value;
    while (value.size() < size) {
      const size_t at = value.size();
      value.resize(at + std::min<size_t>(kChunk, size - at));
      guarded([&] { socket_->recv_exact(value.data() + at, value.size() - at, deadline_); });
    }
    return value;
  }
  std::string str() {
    Bytes b = bytes();
    return std::string(b.begin(), b.end());
  }
  int64_t count() {
    int64_t n = i64();
    if (n < 0 || static_cast<uint64_t>(n) > wire::kMaxReplyLen) {
      protocol_error(str_cat("count ", n));
    }
    return n;
  }

  [[noreturn]] void protocol_error(const std::string& what) {
    std::string why = str_cat("unexpected ", what, " in a reply");
    socket_->close();
    store_.mark_broken(why);
    throw core::DistStoreError(str_cat(prefix(), why));
  }

  // Waits for a WAIT (or BARRIER) reply until `deadline`; on expiry cancels the wait on the
  // server. Returns true when the keys arrived (STOP_WAITING came first), false when the
  // wait was cancelled. The connection stays in step either way.
  bool wait_reply(const Deadline& deadline) {
    const bool ready = readable(deadline);
    // The wait may have used up the call's deadline; what follows gets a fresh one.
    deadline_ = Deadline(store_.timeout());
    if (ready) {
      expect_byte(static_cast<uint8_t>(wire::WaitReply::kStopWaiting), "wait reply");
      return true;
    }
    request_.query(QueryType::kCancelWait);
    send();
    uint8_t r = u8();
    bool arrived = false;
    if (r == static_cast<uint8_t>(wire::WaitReply::kStopWaiting)) {
      arrived = true;
      r = u8();
    }
    if (r != static_cast<uint8_t>(wire::WaitReply::kWaitCanceled)) {
      protocol_error(str_cat("byte ", int(r), " after CANCEL_WAIT"));
    }
    return arrived;
  }

  void expect_byte(uint8_t expected, const char* what) {
    uint8_t got = u8();
    if (got != expected) protocol_error(str_cat(what, " ", int(got)));
  }

 private:
  template <typename T>
  T read() {
    T value;
    guarded([&] { socket_->recv_exact(&value, sizeof value, deadline_); });
    return value;
  }

  template <typename F>
  auto guarded(F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const core::DistTimeoutError& e) {
      socket_->close();
      store_.mark_broken(e.what());
      throw core::DistStoreTimeoutError(str_cat(prefix(), e.what(), " (store timeout ",
                                                core::format_timeout(store_.timeout()), ")"));
    } catch (const core::DistNetworkError& e) {
      socket_->close();
      store_.mark_broken(e.what());
      throw core::DistNetworkError(str_cat(prefix(), e.what()));
    }
  }

  TCPStore& store_;
  const char* op_;
  std::unique_lock<std::mutex> lock_;
  net::Socket* socket_;  // the main connection (lock_ held) or one the caller owns
  Deadline deadline_;
  wire::Encoder request_;
};

TCPStore::TCPStore(std::string host, const TCPStoreOptions& options)
    : Store(options.timeout), host_(std::move(host)), port_(options.port),
      secret_(options.secret ? options.secret : default_secret()), use_libuv_(options.use_libuv),
      max_reply_bytes_(options.max_reply_bytes ? *options.max_reply_bytes : default_max_reply()) {
  if (options.is_server) {
    server_ = start_server(host_, options);
    port_ = server_->port();
  }
  socket_ = open_connection();
  // As in torch, only instances that wait for the workers register (so with
  // wait_for_workers=False num_keys() counts the user's keys alone).
  if (!options.num_workers || !options.wait_workers) return;
  if (options.is_server) {
    wait_for_workers(*options.num_workers);
  } else {
    Call call(*this, "register");
    call.request().query(QueryType::kAdd).str(kInitKey).i64(1);
    call.send();
    call.i64();
  }
}

TCPStore::TCPStore(CloneTag, std::string host, uint16_t port, Millis timeout,
                   std::optional<std::string> secret, uint64_t max_reply_bytes)
    : Store(timeout), host_(std::move(host)), port_(port), secret_(std::move(secret)),
      max_reply_bytes_(max_reply_bytes) {
  socket_ = open_connection();
}

TCPStore::~TCPStore() {
  // Close our connections before a server we own shuts down, so it sees ordinary
  // disconnects.
  std::lock_guard<std::mutex> lock(mu_);
  socket_.close();
  std::lock_guard<std::mutex> pool_lock(pool_mu_);
  wait_sockets_.clear();
}

std::string TCPStore::describe() const { return str_cat("TCPStore(", endpoint(host_, port_), ")"); }

void TCPStore::mark_broken(const std::string& why) {
  std::lock_guard<std::mutex> lock(pool_mu_);
  if (broken_.empty()) broken_ = why;
  is_broken_.store(true, std::memory_order_release);
  wait_sockets_.clear();
}

std::string TCPStore::broken_reason() {
  std::lock_guard<std::mutex> lock(pool_mu_);
  return broken_.empty() ? "the connection was closed" : broken_;
}

net::Socket TCPStore::open_connection(bool retry) {
  const Millis timeout = this->timeout();
  const Deadline deadline(timeout);
  const auto nonce = static_cast<uint32_t>(::getpid());
  std::minstd_rand rng(std::random_device{}());
  std::uniform_real_distribution<double> jitter(0.5, 1.5);
  Millis backoff = kFirstBackoff;
  std::string last_error;
  int handshake_drops = 0;  // in a row
  while (true) {
    net::Socket socket;
    net::Status status = net::Socket::connect(host_, port_, deadline, socket);
    if (status.ok()) {
      socket.set_peer_name(str_cat("the store server at ", endpoint(host_, port_)));
      try {
        wire::Encoder hello;
        hello.query(QueryType::kValidate).u32(wire::kValidationMagic);
        if (secret_) hello.query(QueryType::kAuth).str(*secret_);
        hello.query(QueryType::kPing).u32(nonce);
        socket.send_all(hello.buffer().data(), hello.buffer().size(), deadline);
        if (secret_) {
          uint8_t ack = 0;
          socket.recv_exact(&ack, sizeof ack, deadline);
        }
        uint32_t echo = 0;
        socket.recv_exact(&echo, sizeof echo, deadline);
        if (echo == nonce) return socket;
        last_error = str_cat("the server answered PING with ", echo, " instead of ", nonce);
      } catch (const core::DistNetworkError& e) {
        // Accepted, then dropped during the handshake: a server that refuses this client, or
        // one that was shutting down while another takes its port (a rank 0 that destroyed
        // its process group and hosts the next one's store). A refusing server drops every
        // attempt, so a few drops in a row end the retries.
        if (!retry || ++handshake_drops >= kHandshakeDrops) {
          std::string why =
              secret_ ? "it rejected this client's shared secret, or speaks another protocol"
                      : "it may require a shared secret (set C10D_STORE_SECRET or pass "
                        "secret=), or speak another protocol (PyTorch before 2.4)";
          throw core::DistNetworkError(
              str_cat(describe(), ": the store server at ", endpoint(host_, port_),
                      " closed the connection during the handshake; ", why, " (", e.what(), ")"));
        }
        last_error = e.what();  // tried again after the usual pause
      } catch (const core::DistError& e) {
        last_error = e.what();
      }
    } else {
      last_error = status.message;
      handshake_drops = 0;
    }
    if (!retry) {
      std::string why = str_cat("the store server at ", endpoint(host_, port_),
                                " refused a new connection although this client reached it "
                                "before (has the server's process exited?): ",
                                last_error);
      mark_broken(why);
      throw core::DistNetworkError(str_cat(describe(), ": ", why));
    }
    if (deadline.expired()) {
      throw core::DistNetworkError(str_cat(
          describe(), ": the client socket has timed out after ", core::format_timeout(timeout),
          " while trying to connect to (", host_, ", ", port_, "): ", last_error));
    }
    auto pause = Millis(static_cast<int64_t>(backoff.count() * jitter(rng)));
    std::this_thread::sleep_for(std::min(pause, deadline.remaining()));
    backoff = std::min(Millis(backoff.count() * 3 / 2), kMaxBackoff);
  }
}

bool TCPStore::block_until_present(const char* op, const std::vector<std::string>& wire_keys,
                                   const Deadline& deadline) {
  {
    // Usually the keys are there already. Asking on the main connection also guarantees
    // that this store's earlier writes (sent there without a reply) are applied before we
    // look, so a thread never waits for its own set().
    Call call(*this, op);
    call.request().query(QueryType::kCheck).u64(wire_keys.size());
    for (const auto& k : wire_keys) call.request().str(k);
    call.send();
    if (call.u8() == static_cast<uint8_t>(wire::CheckReply::kReady)) return true;
  }
  net::Socket socket;
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    if (!wait_sockets_.empty()) {
      socket = std::move(wait_sockets_.back());
      wait_sockets_.pop_back();
    }
  }
  if (!socket.valid()) socket = open_connection(/*retry=*/false);
  bool arrived = false;
  {
    Call call(*this, op, socket);
    call.request().query(QueryType::kWait).u64(wire_keys.size());
    for (const auto& k : wire_keys) call.request().str(k);
    call.send();
    arrived = call.wait_reply(deadline);
  }
  // Still in step after a completed or cancelled wait: keep it for the next one.
  std::lock_guard<std::mutex> lock(pool_mu_);
  if (!is_broken_.load(std::memory_order_relaxed)) wait_sockets_.push_back(std::move(socket));
  return arrived;
}

void TCPStore::wait_for_workers(int num_workers) {
  // BARRIER adds our registration to init/ and answers once init/ reaches num_workers; every
  // worker's ADD on init/ re-checks it on the server, so nothing polls.
  Call call(*this, "wait for workers");
  call.request().query(QueryType::kBarrier).str(kInitKey).i64(num_workers);
  call.send();
  if (call.wait_reply(call.deadline())) return;
  call.request().query(QueryType::kAdd).str(kInitKey).i64(0);
  call.send();
  int64_t joined = call.i64();
  // A store error, as torch raises here, that is also a timeout in Python.
  throw core::DistStoreTimeoutError(
      str_cat(describe(), ": Timed out after ", seconds_text(timeout()),
              " seconds waiting for clients. ", joined, "/", num_workers, " clients joined."));
}

void TCPStore::set(const std::string& key, const Bytes& value) {
  Call call(*this, "set");
  call.check_value(value);
  call.request().query(QueryType::kSet).str(call.key(key)).bytes(value);
  call.send();
}

Bytes TCPStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  Call call(*this, "compare_set");
  call.check_value(expected);
  call.check_value(desired);
  call.request().query(QueryType::kCompareSet).str(call.key(key)).bytes(expected).bytes(desired);
  call.send();
  return call.bytes();
}

Bytes TCPStore::get(const std::string& key) {
  const Millis timeout = this->timeout();
  std::string k = wire_key(describe() + ": get: ", key);
  bool ready;
  {
    // The GET goes only once CHECK found the key: PyTorch's non-libuv server drops a client
    // that GETs a missing key.
    Call call(*this, "get");
    call.request().query(QueryType::kCheck).u64(1).str(k);
    call.send();
    ready = call.u8() == static_cast<uint8_t>(wire::CheckReply::kReady);
  }
  if (!ready && !block_until_present("get", {k}, key_deadline(timeout))) {
    throw_wait_timeout(describe(), {k}, timeout);
  }
  Call call(*this, "get");
  call.request().query(QueryType::kGet).str(k);
  call.send();
  return call.bytes();
}

int64_t TCPStore::add(const std::string& key, int64_t delta) {
  Call call(*this, "add");
  call.request().query(QueryType::kAdd).str(call.key(key)).i64(delta);
  call.send();
  return call.i64();
}

bool TCPStore::delete_key(const std::string& key) {
  Call call(*this, "delete_key");
  call.request().query(QueryType::kDeleteKey).str(call.key(key));
  call.send();
  return call.i64() > 0;
}

bool TCPStore::check(const std::vector<std::string>& keys) {
  Call call(*this, "check");
  call.request().query(QueryType::kCheck);
  call.keys(keys);
  call.send();
  uint8_t r = call.u8();
  if (r == static_cast<uint8_t>(wire::CheckReply::kReady)) return true;
  if (r == static_cast<uint8_t>(wire::CheckReply::kNotReady)) return false;
  call.protocol_error(str_cat("CHECK reply ", int(r)));
}

int64_t TCPStore::num_keys() {
  Call call(*this, "num_keys");
  call.request().query(QueryType::kGetNumKeys);
  call.send();
  return call.i64();
}

void TCPStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  // Our server only answers once every key exists; the deadline is ours to enforce.
  const std::vector<std::string> ks = wire_keys(describe() + ": wait: ", keys);
  if (!block_until_present("wait", ks, key_deadline(timeout))) {
    throw_wait_timeout(describe(), ks, timeout);
  }
}

void TCPStore::append(const std::string& key, const Bytes& value) {
  Call call(*this, "append");
  call.check_value(value);
  call.request().query(QueryType::kAppend).str(call.key(key)).bytes(value);
  call.send();
}

std::vector<Bytes> TCPStore::multi_get(const std::vector<std::string>& keys) {
  const Millis timeout = this->timeout();
  std::vector<std::string> ks = wire_keys(describe() + ": multi_get: ", keys);
  if (!block_until_present("multi_get", ks, key_deadline(timeout))) {
    throw_wait_timeout(describe(), ks, timeout);
  }
  Call call(*this, "multi_get");
  call.request().query(QueryType::kMultiGet).u64(ks.size());
  for (const auto& k : ks) call.request().str(k);
  call.send();
  std::vector<Bytes> values;
  values.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) values.push_back(call.bytes());
  return values;
}

void TCPStore::multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  C10D_CHECK_ARG_EQ(keys.size(), values.size(), describe(),
                    ": multi_set: keys and values differ in length");
  Call call(*this, "multi_set");
  call.check_count(keys.size());
  call.request().query(QueryType::kMultiSet).u64(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    call.check_value(values[i]);
    call.request().str(call.key(keys[i])).bytes(values[i]);
  }
  call.send();
}

void TCPStore::queue_push(const std::string& key, const Bytes& value) {
  Call call(*this, "queue_push");
  call.check_value(value);
  call.request().query(QueryType::kQueuePush).str(call.key(key)).bytes(value);
  call.send();
}

Bytes TCPStore::queue_pop(const std::string& key, bool block) {
  const Millis timeout = this->timeout();
  const Deadline deadline = key_deadline(timeout);
  std::string k = wire_key(describe() + ": queue_pop: ", key);
  while (true) {
    {
      Call call(*this, "queue_pop");
      call.request().query(QueryType::kQueuePop).str(k);
      call.send();
      if (call.i64() > 0) return call.bytes();
      if (!block) {
        throw core::DistQueueEmptyError(str_cat(call.prefix(), "queue '", key, "' is empty"));
      }
    }
    // A non-empty queue counts as a present key. Another popper may still take the item
    // first; then we wait again within the same deadline.
    if (!block_until_present("queue_pop", {k}, deadline)) {
      throw_wait_timeout(describe(), {k}, timeout);
    }
  }
}

int64_t TCPStore::queue_len(const std::string& key) {
  Call call(*this, "queue_len");
  call.request().query(QueryType::kQueueLen).str(call.key(key));
  call.send();
  return call.i64();
}

std::vector<std::string> TCPStore::list_keys() {
  Call call(*this, "list_keys");
  call.request().query(QueryType::kListKeys);
  call.send();
  int64_t n = call.count();
  std::vector<std::string> keys;
  for (int64_t i = 0; i < n; ++i) {
    std::string k = call.str();
    // Only user keys: the registration key and other clients' raw keys lack the prefix.
    if (k.rfind(kKeyPrefix, 0) == 0) keys.push_back(k.substr(1));
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

std::shared_ptr<Store> TCPStore::clone() {
  return std::make_shared<TCPStore>(CloneTag{}, host_, port_, timeout(), secret_, max_reply_bytes_);
}

}  // namespace c10d::store
