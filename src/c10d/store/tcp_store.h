// TCPStore: a Store served over TCP, wire-compatible with PyTorch's TCPStore (>= 2.4).
// One process runs the server (is_server); every participant, the server's own process
// included, talks to it through a client connection.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "c10d/net/socket.h"
#include "c10d/store/store.h"

namespace c10d::store {

class TCPServer;

struct TCPStoreOptions {
  uint16_t port = 29500;
  bool is_server = false;
  std::optional<int> num_workers;  // world size; nullopt = not fixed
  bool wait_workers = true;
  Millis timeout = kDefaultStoreTimeout;
  bool multi_tenant = false;  // share one TCPServer per (host, port) inside a process
  std::optional<int> master_listen_fd;
  // torch's choice between its libuv server and an older one. c10d's server always runs on
  // libuv; the option is only recorded (libuv_backend() reports it, as torch's does).
  bool use_libuv = true;
  // Shared secret (c10d extension). A server with one refuses clients without it; a client
  // with one authenticates after connecting. Defaults to C10D_STORE_SECRET when set.
  std::optional<std::string> secret;
  // The largest value this client reads from a server (a longer one is a protocol error);
  // defaults to C10D_STORE_MAX_REPLY_BYTES.
  std::optional<uint64_t> max_reply_bytes;
};

// Thread-safe. Requests go over one main connection guarded by a mutex, so calls from one
// thread reach the server in program order and short calls from many threads are serialised.
// A call that must block until keys exist (wait, get, multi_get, blocking queue_pop) first
// checks on the main connection and, only if a key is missing, blocks on a separate wait
// connection, so one thread's long wait never stalls the others (PyTorch's client holds its
// only connection for the whole wait). Every read from the server has a deadline (the store
// timeout), so a dead or silent server turns into an error, never a hang. After a network
// error or a timed-out reply the store is unusable and every later call fails at once with
// DistNetworkError; a timed-out wait()/get() is cancelled cleanly and leaves the store
// usable.
//
// User keys travel with a "/" prefix (as PyTorch's client sends them); each instance with
// num_workers and wait_workers (clones never) registers by adding 1 to the unprefixed key
// "init/", which num_keys() counts.
class TCPStore : public Store {
 public:
  // Starts the server first when options.is_server, then connects (retrying with backoff
  // until the timeout) and, with num_workers and wait_workers, registers; a server then waits
  // until num_workers instances have registered, else throws DistStoreTimeoutError "Timed out
  // after N seconds waiting for clients. x/y clients joined."
  explicit TCPStore(std::string host, const TCPStoreOptions& options = {});
  ~TCPStore() override;

  uint16_t port() const { return port_; }  // the real port, after port 0 was resolved
  const std::string& host() const { return host_; }
  bool libuv_backend() const { return use_libuv_; }

  void set(const std::string& key, const Bytes& value) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool delete_key(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t num_keys() override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, Millis timeout) override;

  void append(const std::string& key, const Bytes& value) override;
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys) override;
  void multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override;
  bool has_extended_api() const override { return true; }

  void queue_push(const std::string& key, const Bytes& value) override;
  Bytes queue_pop(const std::string& key, bool block) override;
  int64_t queue_len(const std::string& key) override;
  std::vector<std::string> list_keys() override;
  std::shared_ptr<Store> clone() override;

  std::string describe() const override;

 private:
  struct CloneTag {};
  class Call;

 public:
  // Used by clone(): a second connection to the same server, without registering.
  TCPStore(CloneTag, std::string host, uint16_t port, Millis timeout,
           std::optional<std::string> secret, uint64_t max_reply_bytes);

 private:
  // Connects, validates and pings, retrying with backoff until the store timeout.
  // With `retry`, keeps trying (backoff) until the store timeout: the server may not be up
  // yet. Without, one attempt: used once this client has reached the server, where a refused
  // connection means the server is gone.
  net::Socket open_connection(bool retry = true);
  void wait_for_workers(int num_workers);
  // Blocks until every (already prefixed) key exists or `deadline` passes; false on timeout.
  // Checks on the main connection first (which also orders the wait after this store's
  // earlier writes), and only blocks on a wait connection when a key is missing.
  bool block_until_present(const char* op, const std::vector<std::string>& wire_keys,
                           const core::Deadline& deadline);
  void mark_broken(const std::string& why);
  std::string broken_reason();

  const std::string host_;
  uint16_t port_;
  const std::optional<std::string> secret_;
  bool use_libuv_ = true;
  const uint64_t max_reply_bytes_;
  std::shared_ptr<TCPServer> server_;  // set when this instance started (or shares) the server

  // Lock order: mu_ before pool_mu_.
  std::mutex mu_;       // guards socket_; held for the whole of each request on it
  net::Socket socket_;  // the main connection: every request except blocking WAITs
  std::mutex pool_mu_;  // guards wait_sockets_ and broken_
  // Idle connections for blocking WAITs, so that a thread blocked in wait()/get() never
  // holds the main connection; one per concurrently blocked thread, reused afterwards.
  std::vector<net::Socket> wait_sockets_;
  std::string broken_;  // why the store's connections are unusable; empty while they are fine
  std::atomic<bool> is_broken_{false};
};

}  // namespace c10d::store
