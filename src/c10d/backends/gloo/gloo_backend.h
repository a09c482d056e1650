// GlooBackend: the CPU collectives of a process group, carried by Gloo over TCP.
//
// Every rank builds one Gloo context per device (a full mesh of TCP pairs, rendezvoused through
// the process group's store). Each operation takes the next value of a 32-bit sequence number
// on the calling thread; it becomes the Gloo tag (slot) of the operation, so operations that
// run at the same time never mix their messages, provided every rank issues its collectives in
// the same order (the usual process-group contract).
//
// all_reduce, reduce_scatter, all_gather, broadcast and barrier run on a TCP ring of c10d's own
// (net/ring.h) next to the Gloo context, unless GlooOptions::ring says otherwise: Gloo's
// transport hands every message to an event-loop thread that spins until the receive is
// posted, which with a few ranks per core costs milliseconds per operation
// (docs/design/gloo.md).
//
// Collectives run one at a time in submission order on the shared queue (pg/op_queue.h): a
// synchronous one with nothing before it on the caller's thread, others on the queue's worker
// or a thread waiting for them. So every rank runs them in the same order, on the ring's one
// set of streams too.
// Point-to-point operations are posted at once on the caller's thread and complete when their
// Work is waited on (like Gloo's own unbound buffers).
//
// Errors: Gloo failures (timeouts, a peer that closed its connection) become
// core::DistTimeoutError / core::DistBackendError naming the operation, its sequence number,
// this rank and, when Gloo's message identifies it, the peer rank. Nothing escapes a worker.
//
// Gloo's TCP writes raise SIGPIPE when a peer dies; the first backend sets SIGPIPE to ignored
// if it still has the default action (Python does the same at startup).
//
// Thread-safety: all methods may be called from any thread; operations issued concurrently
// from several threads get sequence numbers in an unspecified order, which is only safe if the
// caller orders them identically on every rank.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "c10d/pg/backend.h"
#include "c10d/pg/op_queue.h"
#include "c10d/pg/signature.h"
#include "c10d/store/store.h"

namespace gloo {
class Context;
namespace transport {
class Device;
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo

namespace c10d::net {
class Ring;
}  // namespace c10d::net

namespace c10d::backends::gloo {

using pg::WorkPtr;
using DevicePtr = std::shared_ptr<::gloo::transport::Device>;

struct GlooOptions {
  // One Gloo context per device; operations alternate between them by sequence number.
  // Empty means create_default_device().
  std::vector<DevicePtr> devices;
  // torch's option for worker threads running asynchronous operations; accepted, but
  // operations run one at a time in submission order (pg/op_queue.h).
  int threads = 2;
  // Timeout of rendezvous and of every operation that does not set its own.
  pg::Millis timeout = pg::kDefaultPgTimeout;
  // Whether the collectives that can run on c10d's TCP ring do; empty means C10D_GLOO_RING.
  std::optional<bool> ring;
};

class GlooBackend : public pg::Backend {
 public:
  // Connects the full mesh of every device through `store` (which the caller should prefix per
  // process group). Throws core::DistBackendError naming rank, size and store on failure.
  GlooBackend(std::shared_ptr<store::Store> store, int rank, int size, GlooOptions opts = {});
  // Calls shutdown().
  ~GlooBackend() override;

  // The IP address this rank's first device listens on (what peers connect to), or "" when it
  // has no peer or the transport's address is not TCP.
  std::string listen_ip() const;

  // A TCP device bound to the address `hostname` resolves to.
  static DevicePtr create_device_for_hostname(const std::string& hostname);
  // A TCP device bound to the first address of network interface `ifname`.
  static DevicePtr create_device_for_interface(const std::string& ifname);
  // GLOO_SOCKET_IFNAME's interfaces if set (first one); else this host's name if it resolves to
  // an address that can be bound locally and is not loopback, or the ranks meet on this host
  // (`peer_host`, e.g. the TCPStore's host, is loopback or unknown); else the local address of
  // the interface that routes to `peer_host`; else the loopback address 127.0.0.1.
  static DevicePtr create_default_device(const std::string& peer_host = "");
  // One device per interface in GLOO_SOCKET_IFNAME, or the single create_default_device().
  static std::vector<DevicePtr> create_default_devices(const std::string& peer_host = "");

  std::string name() const override { return "gloo"; }
  // The transport devices, one context each.
  const std::vector<DevicePtr>& devices() const { return devices_; }
  bool supports_splitting() const override { return true; }

  WorkPtr broadcast(std::vector<pg::Tensor>& tensors, const pg::BroadcastOptions& opts) override;
  WorkPtr allreduce(std::vector<pg::Tensor>& tensors, const pg::AllreduceOptions& opts) override;
  WorkPtr reduce(std::vector<pg::Tensor>& tensors, const pg::ReduceOptions& opts) override;
  WorkPtr allgather_base(pg::Tensor& output, pg::Tensor& input,
                         const pg::AllgatherOptions& opts) override;
  WorkPtr allgather_into_tensor_coalesced(std::vector<pg::Tensor>& outputs,
                                          std::vector<pg::Tensor>& inputs,
                                          const pg::AllgatherOptions& opts) override;
  WorkPtr gather(std::vector<std::vector<pg::Tensor>>& outputs, std::vector<pg::Tensor>& inputs,
                 const pg::GatherOptions& opts) override;
  WorkPtr scatter(std::vector<pg::Tensor>& outputs, std::vector<std::vector<pg::Tensor>>& inputs,
                  const pg::ScatterOptions& opts) override;
  WorkPtr reduce_scatter(std::vector<pg::Tensor>& outputs,
                         std::vector<std::vector<pg::Tensor>>& inputs,
                         const pg::ReduceScatterOptions& opts) override;
  WorkPtr reduce_scatter_base(pg::Tensor& output, pg::Tensor& input,
                              const pg::ReduceScatterOptions& opts) override;
  WorkPtr reduce_scatter_tensor_coalesced(std::vector<pg::Tensor>& outputs,
                                          std::vector<pg::Tensor>& inputs,
                                          const pg::ReduceScatterOptions& opts) override;
  WorkPtr alltoall_base(pg::Tensor& output, pg::Tensor& input,
                        std::vector<int64_t>& output_split_sizes,
                        std::vector<int64_t>& input_split_sizes,
                        const pg::AllToAllOptions& opts) override;
  WorkPtr alltoall(std::vector<pg::Tensor>& outputs, std::vector<pg::Tensor>& inputs,
                   const pg::AllToAllOptions& opts) override;
  WorkPtr send(std::vector<pg::Tensor>& tensors, int dst_rank, int tag) override;
  WorkPtr recv(std::vector<pg::Tensor>& tensors, int src_rank, int tag) override;
  WorkPtr recv_anysource(std::vector<pg::Tensor>& tensors, int tag) override;
  WorkPtr barrier(const pg::BarrierOptions& opts) override;
  void monitored_barrier(const pg::BarrierOptions& opts, bool wait_all_ranks) override;

  // Fails queued operations, resets the connections if an operation still runs (so it fails
  // at once instead of waiting for peers; otherwise they close softly with the backend, as
  // torch's do) and lets the queue's worker go: one still in a Gloo call after a short grace
  // fails its operation and finishes on its own. Idempotent.
  void finish_pending(pg::Millis timeout) override;
  void shutdown() override;

  // Sequence number the next operation will take (for tests and debug output).
  uint32_t next_sequence() const;

  // Everything an operation needs to run: its context, tag and timeout. Public for the
  // helpers in collectives.cc; not part of the API.
  struct OpContext {
    std::shared_ptr<::gloo::Context> context;
    uint32_t tag = 0;
    pg::Millis timeout{0};  // already resolved: > 0
    int rank = 0;
    int size = 0;
    // The ring, for operations whose data runs on it.
    net::Ring* ring = nullptr;
    // The user's call, which every rank checks against the others' before data moves.
    pg::Signature call;
  };

 private:
  using Body = std::function<void(const OpContext&)>;
  // What running an operation needs, shared with the queue's worker. Defined in internal.h.
  struct Shared;

  // Queues `body` on the shared queue; the Work completes with `outputs`. `call` (its sequence
  // number filled in) and `traffic` are checked against every rank's before the body runs
  // (see run). `on_ring`: the body may run its reductions on the ring, whose messages carry
  // the call.
  WorkPtr submit(const char* op_name, pg::Signature call, pg::Millis op_timeout, bool async,
                 Body body, std::vector<pg::Tensor> outputs, bool on_ring = false,
                 pg::Traffic traffic = {});
  // Runs one operation, throwing its error in our terms. Every collective first checks its
  // call against the other ranks': on the ring (the previous member's, and with traffic,
  // everyone's), else through one Gloo all-gather of every rank's call. Either way the first
  // message of every operation has the same size on every rank, so ranks in different
  // operations fail naming both instead of Gloo aborting on a message of the wrong size.
  static void run(const Shared& shared, const char* op_name, OpContext& op, bool ring_data,
                  const pg::Traffic& traffic, const Body& body);
  static void agree(const Shared& shared, const char* op_name, const OpContext& op,
                    const pg::Traffic& traffic);
  // monitored_barrier's messages, run as operation `c` (the caller waits for it).
  void run_monitored_barrier(const OpContext& c, bool wait_all_ranks);
  // Publishes this rank's listening address and reads everyone else's (for error messages).
  void exchange_addresses();
  WorkPtr post_p2p(core::OpType type, std::vector<pg::Tensor>& tensors, int peer, int tag);

  std::shared_ptr<store::Store> store_;
  std::vector<DevicePtr> devices_;
  std::shared_ptr<Shared> shared_;
  std::shared_ptr<pg::OpQueue> queue_;
  // Receives given up on (monitored_barrier) but still registered with Gloo: a late message
  // must find its buffer alive, or the pair stalls. Kept until the backend goes away.
  struct Parked {
    std::unique_ptr<char> byte;
    std::unique_ptr<::gloo::transport::UnboundBuffer> buffer;
  };
  std::mutex parked_mutex_;
  std::vector<Parked> parked_;  // guarded by parked_mutex_
  std::mutex shutdown_mutex_;   // serialises shutdown()
};

}  // namespace c10d::backends::gloo
