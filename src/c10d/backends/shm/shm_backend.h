// ShmBackend: collectives between processes of one host through shared memory.
//
// Every rank maps every peer's segment (see segment.h). Collectives advance in "steps": at
// step s a rank writes into its own slot of parity s % 2, publishes s in its step flag, waits
// until every peer has published s, and then reads the peers' slots of that parity. A rank
// publishes s + 1 only after it finished reading step s, so a slot is never rewritten while a
// peer still reads it, and no step needs a second barrier. Waits spin briefly and then sleep
// on a futex in the shared memory, checking every few milliseconds whether the awaited peers
// are still alive, whether the operation's deadline passed, and whether shutdown() was called.
//
// Algorithms: small allreduces copy in once and every rank reduces all slots; large ones stream
// chunks through the slots, each rank reducing its slice of a chunk (owner computes) while the
// previous chunk's slices are copied out. Tensors allocated by empty() live in the shared heap:
// allreduce on them reads the peers' tensors directly (one copy per byte). A rank only ever
// writes its own memory and segment: what it needs of a peer it reads, so a peer that resumes
// after this rank gave up on an operation cannot write into memory this rank reused.
// Point-to-point messages go through one channel per ordered pair of ranks.
//
// Operations run one at a time in submission order on the shared queue (pg/op_queue.h): a
// synchronous one with nothing before it on the caller's thread, others on its worker thread
// or a thread waiting for them. Collectives must be issued in the same order on every rank.
// After an operation fails (timeout, dead peer) the backend's step flags no longer agree, so
// every later collective fails at once with the original error.
//
// Thread-safety: all methods may be called from any thread.
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
#include "c10d/store/store.h"

namespace c10d::backends::shm {

class Segment;
class StepChannel;
class P2PEngine;

struct ShmOptions {
  // Timeout of rendezvous and of every operation that does not set its own.
  pg::Millis timeout = pg::kDefaultPgTimeout;
  // Shared heap per rank for empty(); 0 means C10D_SHM_HEAP_BYTES.
  size_t heap_bytes = 0;
};

class ShmBackend : public pg::Backend {
 public:
  // Creates and maps the segments through `store` (which the caller prefixes per process
  // group). Throws core::DistBackendError when the ranks are not on one host or the
  // rendezvous fails.
  ShmBackend(std::shared_ptr<store::Store> store, int rank, int size, ShmOptions opts = {});
  ~ShmBackend() override;

  std::string name() const override { return "shm"; }

  // A C-contiguous tensor in this rank's shared heap; collectives on it can skip the copy
  // through the slots. The memory stays valid after the backend is gone.
  core::Tensor empty(std::vector<int64_t> sizes, core::DType dtype);
  // Whether [data, data + bytes) lies in this rank's shared heap (memory from empty()).
  bool in_shared_heap(const void* data, size_t bytes) const;
  // Adoption (pg::Backend): the whole pages of an ordinary buffer move into this rank's shared
  // heap at the same addresses (see alias.h), so that allreduces on it read in place like on
  // empty()'s tensors. kBusy while an operation of this backend is queued or running, or a
  // receive is posted (one could write into the buffer while it moves); kRefused when it
  // cannot (see adopt_into_heap; also without cross-memory attach). The process-level
  // handlers are alias.h's release_aliases_in / forget_aliases_in.
  bool adopts_memory() const override { return true; }
  Adoption adopt(void* data, size_t bytes) override;
  // Whether part of [data, data + bytes) is such an alias of this backend's heap (checked
  // against pagemap unless `verify` is false: see find_alias).
  bool adopted(const void* data, size_t bytes, bool verify) const override;
  // empty(), but nullopt when the heap is full.
  std::optional<core::Tensor> empty_for_collectives(const std::vector<int64_t>& sizes,
                                                    core::DType dtype) override;

  pg::WorkPtr broadcast(std::vector<pg::Tensor>& tensors,
                        const pg::BroadcastOptions& opts) override;
  pg::WorkPtr allreduce(std::vector<pg::Tensor>& tensors,
                        const pg::AllreduceOptions& opts) override;
  bool has_inline(core::OpType type) const override;
  pg::WorkPtr run_inline(const pg::InlineOp& op) override;
  pg::WorkPtr reduce(std::vector<pg::Tensor>& tensors, const pg::ReduceOptions& opts) override;
  pg::WorkPtr allgather_base(pg::Tensor& output, pg::Tensor& input,
                             const pg::AllgatherOptions& opts) override;
  pg::WorkPtr allgather_into_tensor_coalesced(std::vector<pg::Tensor>& outputs,
                                              std::vector<pg::Tensor>& inputs,
                                              const pg::AllgatherOptions& opts) override;
  pg::WorkPtr gather(std::vector<std::vector<pg::Tensor>>& outputs, std::vector<pg::Tensor>& inputs,
                     const pg::GatherOptions& opts) override;
  pg::WorkPtr scatter(std::vector<pg::Tensor>& outputs,
                      std::vector<std::vector<pg::Tensor>>& inputs,
                      const pg::ScatterOptions& opts) override;
  pg::WorkPtr reduce_scatter(std::vector<pg::Tensor>& outputs,
                             std::vector<std::vector<pg::Tensor>>& inputs,
                             const pg::ReduceScatterOptions& opts) override;
  pg::WorkPtr reduce_scatter_base(pg::Tensor& output, pg::Tensor& input,
                                  const pg::ReduceScatterOptions& opts) override;
  pg::WorkPtr reduce_scatter_tensor_coalesced(std::vector<pg::Tensor>& outputs,
                                              std::vector<pg::Tensor>& inputs,
                                              const pg::ReduceScatterOptions& opts) override;
  pg::WorkPtr alltoall_base(pg::Tensor& output, pg::Tensor& input,
                            std::vector<int64_t>& output_split_sizes,
                            std::vector<int64_t>& input_split_sizes,
                            const pg::AllToAllOptions& opts) override;
  pg::WorkPtr alltoall(std::vector<pg::Tensor>& outputs, std::vector<pg::Tensor>& inputs,
                       const pg::AllToAllOptions& opts) override;
  pg::WorkPtr send(std::vector<pg::Tensor>& tensors, int dst_rank, int tag) override;
  pg::WorkPtr recv(std::vector<pg::Tensor>& tensors, int src_rank, int tag) override;
  pg::WorkPtr recv_anysource(std::vector<pg::Tensor>& tensors, int tag) override;
  pg::WorkPtr barrier(const pg::BarrierOptions& opts) override;
  void monitored_barrier(const pg::BarrierOptions& opts, bool wait_all_ranks) override;

  // Fails queued operations, makes running waits fail within a few milliseconds, tells the
  // peers this rank is gone and joins the worker. Never waits for peers. Idempotent.
  void finish_pending(pg::Millis timeout) override;
  void shutdown() override;

  // Number of collectives issued so far (for tests and debug output).
  uint64_t next_sequence() const;
  // Whether the last timed round trip between ranks 0 and 1 found their CPUs far apart (the
  // copies into the slots then use streaming stores; C10D_SHM_FAR_TRIP_NS), as this rank last
  // heard; nullopt where nobody times them. For tests and debug output.
  std::optional<bool> cpus_far_apart() const;

 private:
  using Body = std::function<void(StepChannel&)>;

  // Queues `body` on the StepChannel (between StepChannel::begin and end, the queue's hooks).
  pg::WorkPtr submit(core::OpType type, const char* name, pg::Millis timeout, bool async, Body body,
                     std::vector<pg::Tensor> outputs);
  pg::WorkPtr post_p2p(core::OpType type, pg::Tensor tensor, int peer, int tag);
  // Posts a send or receive of `bytes` at `data`. Without `hold` it waits for the end and
  // returns null; with it, it returns the operation's Work, and asks `hold` for a tensor
  // keeping the buffer alive if the operation outlives the call.
  pg::WorkPtr post_p2p(core::OpType type, char* data, size_t bytes, core::DType dtype, int peer,
                       int tag, pg::Millis timeout, const pg::BufferHold& hold);

  std::shared_ptr<store::Store> store_;
  std::shared_ptr<Segment> segment_;
  std::shared_ptr<StepChannel> channel_;
  std::shared_ptr<P2PEngine> p2p_;
  // The Work of every send that completed as it was posted: completed, no outputs, shared.
  pg::WorkPtr sent_;
  std::shared_ptr<pg::OpQueue> queue_;
  std::mutex shutdown_mutex_;
};

}  // namespace c10d::backends::shm
