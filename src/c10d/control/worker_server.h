// The per-rank HTTP server of the control plane: `GET /handler/` lists the registered
// handlers (a JSON array of names) and `POST /handler/<name>` runs one (see handlers.h).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "c10d/store/store.h"

namespace c10d::control {

struct WorkerServerOptions {
  // With port == -1: the path of a unix socket (created with mode 0600; a stale socket file
  // at the path is replaced). Otherwise the address to bind ("" or "0.0.0.0": every
  // interface).
  std::string host_or_file;
  // -1: unix socket; 0: a free TCP port chosen by the kernel (see WorkerServer::port()).
  int port = -1;
  // The store the built-in "store_keys" handler lists; may be null.
  std::shared_ptr<store::Store> store;
  // When non-empty, every request must carry "Authorization: Bearer <secret>" or is refused
  // with 401. Unset: the value of C10D_CONTROL_SECRET (empty: no authentication).
  std::optional<std::string> secret;
};

// Serves requests on a thread of its own (and a small pool for the handlers) from
// construction until shutdown(). Thread-safe; shutdown() may be called more than once and is
// called by the destructor.
class WorkerServer {
 public:
  // Binds before returning: a bad address or path throws core::DistNetworkError naming it.
  explicit WorkerServer(WorkerServerOptions options);
  explicit WorkerServer(const std::string& host_or_file, int port = -1);
  ~WorkerServer();
  WorkerServer(const WorkerServer&) = delete;
  WorkerServer& operator=(const WorkerServer&) = delete;

  // Stops accepting, waits for the serving thread and removes the socket file. Requests in
  // flight finish first, so do not call it from a handler.
  void shutdown();

  // The bound TCP port, or -1 for a unix socket.
  int port() const { return port_; }
  // The unix socket path, or "" for TCP.
  const std::string& socket_path() const { return socket_path_; }
  // "unix:<path>" or "<host>:<port>", as published by c10d.control.
  std::string address() const;
  bool requires_auth() const { return !secret_.empty(); }

 private:
  struct Impl;
  void bind(const WorkerServerOptions& options);
  void install_routes();

  std::unique_ptr<Impl> impl_;
  std::shared_ptr<store::Store> store_;
  std::string secret_;
  std::string host_;
  std::string socket_path_;
  int port_ = -1;
  std::atomic<bool> loop_exited_{false};  // set by thread_ when the serving loop returns
  std::thread thread_;
  std::mutex shutdown_mutex_;
  bool stopped_ = false;  // guarded by shutdown_mutex_
};

}  // namespace c10d::control
