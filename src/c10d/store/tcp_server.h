// The TCPStore server: a libuv event loop on a background thread that speaks the TCPStore
// wire protocol (c10d/store/wire.h) to any number of clients, ours or PyTorch's.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace c10d::store {

struct TCPServerOptions {
  // Address to bind. nullopt binds every interface: "::" (dual-stack), falling back to
  // "0.0.0.0" where IPv6 is unavailable.
  std::optional<std::string> host;
  // 0 lets the kernel pick a free port; port() reports it.
  uint16_t port = 0;
  // An already-bound socket to serve on instead of binding (e.g. inherited from a launcher).
  // The server duplicates it, so the caller keeps ownership of its descriptor.
  std::optional<int> listen_fd;
  // When set, a client must send AUTH with this secret right after VALIDATE; one that does
  // not, or sends another secret, is logged and dropped.
  std::optional<std::string> secret;
};

// Thread-safety: the constructor, port() and the destructor may be called from any thread.
// All store data and client state live on the loop thread and are only touched there, so the
// server needs no locks; the only cross-thread signal is the uv_async that stops the loop.
//
// A client that sends garbage, a bad magic number, an oversize length or that disconnects in
// the middle of a request is logged (one line on stderr) and dropped; the others keep being
// served, and no client can make the server allocate more than the protocol limits allow per
// field. What one connection makes the server hold for it is bounded too: a request whose reply
// would pass 32 MiB (a MULTI_GET of many large values) drops that client, and a client with
// 4 MiB of replies not yet read is not read from until it drains them, so one connection holds
// at most about 36 MiB of replies however many requests it pipelines.
class TCPServer {
 public:
  // Binds and listens synchronously (errors throw core::DistNetworkError naming the address
  // and the errno text), then starts the loop thread.
  explicit TCPServer(const TCPServerOptions& options);
  // Stops the loop, closes every connection and joins the thread.
  ~TCPServer();
  TCPServer(const TCPServer&) = delete;
  TCPServer& operator=(const TCPServer&) = delete;

  uint16_t port() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace c10d::store
