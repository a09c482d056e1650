// The hierarchical CPU backend: shared memory among the ranks of a host (the shm backend),
// the network only between hosts (Gloo), for groups whose ranks span hosts.
//
// all_reduce: every host reduces in shared memory; then local rank l of every host
// all_reduces part l of the tensor with local rank l of the other hosts (every rank of a host
// carries a share of the traffic, all hosts' links busy at once); then each host's ranks hand
// each other their parts. broadcast and reduce go through the root's local rank on every host.
// When hosts hold different numbers of ranks, the hosts' first ranks do the network part.
// Every other operation runs on a Gloo group of all ranks.
//
// Operations run in submission order on one thread per backend, so that the shm and Gloo
// groups below see the same sequence of operations on every rank.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "c10d/net/ring.h"
#include "c10d/pg/backend.h"
#include "c10d/pg/op_queue.h"
#include "c10d/store/store.h"

namespace c10d::backends::hier {

using pg::Tensor;
using pg::WorkPtr;

// Which ranks share a host, found through the store (every rank publishes its host).
struct Topology {
  std::vector<std::vector<int>> hosts;  // the ranks of each host, hosts by their lowest rank
  int host = 0;                         // this rank's host
  int local_rank = 0;                   // its index among its host's ranks
  // Every host holds the same number of ranks.
  bool uniform() const;
  int local_size() const { return static_cast<int>(hosts[host].size()); }
  int host_count() const { return static_cast<int>(hosts.size()); }
};

// Every rank calls it: publishes this rank's host under `prefix` and reads everyone's.
Topology discover_topology(store::Store& store, int rank, int size, const std::string& prefix);

class HierBackend : public pg::Backend {
 public:
  HierBackend(std::shared_ptr<store::Store> store, int rank, int size, Topology topology,
              pg::Millis timeout = pg::kDefaultPgTimeout);
  ~HierBackend() override;

  // The backend "auto" picks: shm when every rank is on this host, else hierarchical.
  static std::shared_ptr<pg::Backend> create_auto(std::shared_ptr<store::Store> store, int rank,
                                                  int size, pg::Millis timeout);

  std::string name() const override { return "hier"; }
  const Topology& topology() const { return topology_; }

  WorkPtr allreduce(std::vector<Tensor>& tensors, const pg::AllreduceOptions& opts) override;
  WorkPtr broadcast(std::vector<Tensor>& tensors, const pg::BroadcastOptions& opts) override;
  WorkPtr reduce(std::vector<Tensor>& tensors, const pg::ReduceOptions& opts) override;
  WorkPtr barrier(const pg::BarrierOptions& opts) override;

  // Over the Gloo group of all ranks.
  WorkPtr allgather(std::vector<std::vector<Tensor>>& outputs, std::vector<Tensor>& inputs,
                    const pg::AllgatherOptions& opts) override;
  WorkPtr allgather_base(Tensor& output, Tensor& input, const pg::AllgatherOptions& opts) override;
  WorkPtr gather(std::vector<std::vector<Tensor>>& outputs, std::vector<Tensor>& inputs,
                 const pg::GatherOptions& opts) override;
  WorkPtr scatter(std::vector<Tensor>& outputs, std::vector<std::vector<Tensor>>& inputs,
                  const pg::ScatterOptions& opts) override;
  WorkPtr reduce_scatter(std::vector<Tensor>& outputs, std::vector<std::vector<Tensor>>& inputs,
                         const pg::ReduceScatterOptions& opts) override;
  WorkPtr reduce_scatter_base(Tensor& output, Tensor& input,
                              const pg::ReduceScatterOptions& opts) override;
  WorkPtr alltoall_base(Tensor& output, Tensor& input, std::vector<int64_t>& output_split_sizes,
                        std::vector<int64_t>& input_split_sizes,
                        const pg::AllToAllOptions& opts) override;
  WorkPtr alltoall(std::vector<Tensor>& outputs, std::vector<Tensor>& inputs,
                   const pg::AllToAllOptions& opts) override;
  WorkPtr send(std::vector<Tensor>& tensors, int dst_rank, int tag) override;
  WorkPtr recv(std::vector<Tensor>& tensors, int src_rank, int tag) override;
  WorkPtr recv_anysource(std::vector<Tensor>& tensors, int tag) override;
  void monitored_barrier(const pg::BarrierOptions& opts, bool wait_all_ranks) override;

  void finish_pending(pg::Millis timeout) override;
  void shutdown() override;
  // Also the shm and Gloo groups' timeouts, which bound each step.
  void set_timeout(pg::Millis timeout) override;

 private:
  // Queues `body` (which takes the operation's sequence number) on the shared queue; a
  // failure breaks the ring and is reported with the host's (failed()).
  WorkPtr submit(core::OpType type, const char* name, pg::Millis timeout, bool async,
                 std::function<void(uint64_t)> body, std::vector<Tensor> outputs);
  // What a failed step leaves behind: the ring broken and the host's shm group shut (their
  // ranks learn at once), and the error to report (with_host_failures).
  std::exception_ptr failed(const std::exception& error);
  // A failed operation's error, with what the other ranks of this host reported of theirs (a
  // carrier that failed between hosts leaves its host's ranks waiting until it shuts down;
  // they name its failure, not the shutdown). Reports this rank's failure too.
  std::exception_ptr with_host_failures(const std::exception& error);
  // The steps of the operations (one at a time: on the worker or on the caller's thread).
  void run_allreduce(Tensor& t, const core::ReduceOp& op, pg::Millis timeout, uint64_t seq);
  void run_broadcast(Tensor& t, int root, pg::Millis timeout, uint64_t seq);
  void run_reduce(Tensor& t, int root, const core::ReduceOp& op, pg::Millis timeout, uint64_t seq);
  void agree_on_host(const pg::Signature& call, pg::Millis timeout);
  void agree_between_hosts(const pg::Signature& call, int carrier, pg::Millis timeout);
  void agree(const std::shared_ptr<pg::Backend>& group, int n, const pg::Signature& call,
             pg::Millis timeout, const std::function<int(int)>& rank_of);
  void settle_hosts(pg::Millis timeout);
  // All-reduces `t` (contiguous) with this rank's peers on the other hosts: the ring, or the
  // cross Gloo group when there is none.
  void cross_allreduce(Tensor t, const pg::AllreduceOptions& o, uint64_t seq);
  // "the host's other ranks were exchanging their parts with rank 3 on host 10.0.0.2": what
  // a local step waits for after the step between hosts (uniform hosts).
  std::string cross_peers_note() const;
  // `count` elements of a buffer kept for the steps (serial: one operation runs at a time).
  Tensor scratch(core::DType dtype, int64_t count);
  // Whether the hierarchical steps apply to `tensors` (one dense C-contiguous tensor).
  static bool hierarchical(const std::vector<Tensor>& tensors);

  const Topology topology_;
  std::shared_ptr<pg::Backend> local_;      // the host's ranks (null when alone on its host)
  std::shared_ptr<pg::Backend> cross_;      // this local rank's peers on the other hosts (or null)
  std::shared_ptr<pg::Backend> world_;      // all ranks (Gloo)
  std::shared_ptr<store::Store> failures_;  // "<rank>": why its operation failed
  std::unique_ptr<net::Ring> ring_;         // all_reduce and broadcast between hosts, beside cross_
  // The local rank whose cross group carries a broadcast or reduce rooted at each rank.
  std::vector<int> local_rank_of_;
  std::vector<int> host_of_;
  Tensor scratch_;  // the largest part all-reduced across hosts so far

  // The operations with steps, in submission order.
  std::shared_ptr<pg::OpQueue> queue_;
};

}  // namespace c10d::backends::hier
