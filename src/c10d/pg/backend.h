// Backend: one implementation of the collectives (gloo, shm, mpi, ...) for one process group.
//
// Contract. The ProcessGroup validates every argument (dtypes, sizes, contiguity, ranks, roots,
// list lengths) before calling a backend, so a backend may assume well-formed input. Every
// call returns a Work at once or after finishing (sync backends); errors during the operation
// are stored in the Work and rethrown by wait(). Every operation honours its timeout
// (kUnsetTimeout = the backend's own) and reports a dead peer as an error naming it.
// A backend that does not implement an operation inherits the default, which throws
// core::NotSupported("Backend <name> does not support <op>").
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "c10d/core/tensor.h"
#include "c10d/core/work.h"
#include "c10d/pg/options.h"

namespace c10d::pg {

using core::Tensor;
using core::Work;
using WorkPtr = std::shared_ptr<Work>;

// A dense, C-contiguous CPU buffer, described without a Tensor object, for the inline fast path.
// `sizes` (ndim entries) may point into the caller's memory.
struct DenseView {
  void* data = nullptr;
  size_t numel = 0;
  core::DType dtype = core::DType::kFloat32;
  int ndim = 0;
  const int64_t* sizes = nullptr;

  size_t nbytes() const { return numel * core::element_size(dtype); }
  char* bytes() const { return static_cast<char*>(data); }
};

// A tensor of a buffer, made on demand, that keeps the buffer alive (InlineOp::hold): making
// one costs more than a small send, which seldom needs it.
struct BufferHold {
  Tensor (*make)(const void* context) = nullptr;
  const void* context = nullptr;
  explicit operator bool() const { return make != nullptr; }
  Tensor operator()() const { return make(context); }
};

// One synchronous collective for the inline fast path (Backend::run_inline). The kinds, and
// what they read:
//   kAllreduce, kBroadcast, kReduce, kBarrier: `input` (in place), `root`, `reduce_op`;
//   kAllgatherBase, kReduceScatterBase, kAlltoallBase (equal splits): `output` and `input`;
//   kGather / kScatter: `input` / `output` and, on the root, `list` (one buffer per rank);
//   kAllgather / kReduceScatter: `input` / `output` and `list` (one buffer per rank);
//   kSend / kRecv: `input` / `output`, the peer in `root`, and `tag`.
// ProcessGroup hands over only well-formed calls (see ProcessGroup::run_inline).
struct InlineOp {
  core::OpType type = core::OpType::kUnknown;
  DenseView input;
  DenseView output;
  const DenseView* list = nullptr;
  size_t list_size = 0;
  int root = 0;
  int tag = 0;
  core::ReduceOp reduce_op;
  Millis timeout = kUnsetTimeout;
  // kSend / kRecv only: when set, the operation is posted and its Work returned at once. The
  // backend asks it, on the calling thread with the GIL held, for a tensor of the buffer of
  // `input` / `output` when the operation outlives the call.
  BufferHold hold;
};

// The process-level side of adoption (Backend::adopt), for memory that backends of any group
// may have adopted: a backend kind that adopts registers its handlers once; the owner of the
// memory calls these, with the GIL or its own lock, from any thread.
struct AdoptedMemoryHandlers {
  // [data, data + bytes) is about to be freed: give its pages back as private memory.
  void (*release)(const void* data, size_t bytes) = nullptr;
  // The owner no longer holds [data, data + bytes) (already freed or replaced): drop the
  // records without touching a page.
  void (*forget)(const void* data, size_t bytes) = nullptr;
};
void register_adopted_memory_handlers(AdoptedMemoryHandlers handlers);
void release_adopted_memory(const void* data, size_t bytes);
void forget_adopted_memory(const void* data, size_t bytes);

// How a failed monitored barrier begins on a rank other than 0, in torch's words (its users
// match them): those ranks hear of the failure from rank 0.
std::string monitored_barrier_failure_on(int rank);
// Rank 0's report of the ranks that did not reach a monitored barrier within `timeout`, in
// torch's words: "Rank 2 failed to pass monitoredBarrier in 1000 ms" ("Ranks 1, 2 ...").
std::string monitored_barrier_missing(const std::vector<int>& ranks, Millis timeout);
// What a rank other than 0 reports when rank 0 did not release it within `timeout`, and when
// rank 0 released it with the news that other ranks failed.
std::string monitored_barrier_unreleased(int rank, Millis timeout);
std::string monitored_barrier_others_failed(int rank, Millis timeout);
// How long a rank other than 0 waits for rank 0 to release it from a monitored barrier: as
// in torch, the `monitored` timeout bounds only rank 0's wait for the others, and the other
// ranks wait as for any operation of the group (`group`), so a rank 0 that arrives late but
// within that time lets everyone pass. `monitored` more allows for rank 0's own wait.
Millis monitored_barrier_release_wait(Millis group, Millis monitored);
// "1, 2, 5".
std::string join_ranks(const std::vector<int>& ranks);

class Backend : public std::enable_shared_from_this<Backend> {
 public:
  Backend(int rank, int size, Millis timeout = kDefaultPgTimeout)
      : rank_(rank), size_(size), timeout_ms_(timeout.count()) {}
  virtual ~Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  Millis timeout() const { return Millis(timeout_ms_.load(std::memory_order_relaxed)); }
  // The timeout operations submitted from now on use when they set none (torch's
  // _set_default_timeout); operations already submitted keep theirs. Backends built on others
  // pass it on.
  virtual void set_timeout(Millis timeout) {
    timeout_ms_.store(timeout.count(), std::memory_order_relaxed);
  }
  // The timeout an operation should use: its own if set, else the backend's.
  Millis effective_timeout(Millis op_timeout) const {
    return op_timeout == kUnsetTimeout ? timeout() : op_timeout;
  }
  virtual std::string name() const = 0;
  // Whether torch's split_group can split this backend into subgroups (Gloo's can).
  virtual bool supports_splitting() const { return false; }
  // The sequence number of the group this backend serves (torch asks a backend for its
  // group's): the first group that registered it and is still alive; 0 when there is none.
  uint64_t group_sequence_number() const;
  // Called by ProcessGroup::register_backend: how to read a group's number (nullopt once the
  // group is gone). Kept unless the group linked before is gone.
  void set_group_sequence(std::function<std::optional<uint64_t>()> source);

  virtual WorkPtr broadcast(std::vector<Tensor>& tensors, const BroadcastOptions& opts);
  virtual WorkPtr allreduce(std::vector<Tensor>& tensors, const AllreduceOptions& opts);
  // Default: one allreduce of all tensors packed together.
  virtual WorkPtr allreduce_coalesced(std::vector<Tensor>& tensors,
                                      const AllreduceCoalescedOptions& opts);
  virtual WorkPtr reduce(std::vector<Tensor>& tensors, const ReduceOptions& opts);
  // Default: allgather_coalesced of the inputs (outputs[k][r] gets rank r's inputs[k]).
  virtual WorkPtr allgather(std::vector<std::vector<Tensor>>& outputs, std::vector<Tensor>& inputs,
                            const AllgatherOptions& opts);
  virtual WorkPtr allgather_base(Tensor& output, Tensor& input, const AllgatherOptions& opts);
  // Default: one allgather_base of all inputs packed together.
  virtual WorkPtr allgather_coalesced(std::vector<std::vector<Tensor>>& outputs,
                                      std::vector<Tensor>& inputs, const AllgatherOptions& opts);
  virtual WorkPtr allgather_into_tensor_coalesced(std::vector<Tensor>& outputs,
                                                  std::vector<Tensor>& inputs,
                                                  const AllgatherOptions& opts);
  virtual WorkPtr gather(std::vector<std::vector<Tensor>>& outputs, std::vector<Tensor>& inputs,
                         const GatherOptions& opts);
  virtual WorkPtr scatter(std::vector<Tensor>& outputs, std::vector<std::vector<Tensor>>& inputs,
                          const ScatterOptions& opts);
  virtual WorkPtr reduce_scatter(std::vector<Tensor>& outputs,
                                 std::vector<std::vector<Tensor>>& inputs,
                                 const ReduceScatterOptions& opts);
  virtual WorkPtr reduce_scatter_base(Tensor& output, Tensor& input,
                                      const ReduceScatterOptions& opts);
  virtual WorkPtr reduce_scatter_tensor_coalesced(std::vector<Tensor>& outputs,
                                                  std::vector<Tensor>& inputs,
                                                  const ReduceScatterOptions& opts);
  // Empty split vectors mean equal splits along dimension 0.
  virtual WorkPtr alltoall_base(Tensor& output, Tensor& input,
                                std::vector<int64_t>& output_split_sizes,
                                std::vector<int64_t>& input_split_sizes,
                                const AllToAllOptions& opts);
  virtual WorkPtr alltoall(std::vector<Tensor>& outputs, std::vector<Tensor>& inputs,
                           const AllToAllOptions& opts);
  virtual WorkPtr send(std::vector<Tensor>& tensors, int dst_rank, int tag);
  virtual WorkPtr recv(std::vector<Tensor>& tensors, int src_rank, int tag);
  // The Work's source_rank() tells which rank sent.
  virtual WorkPtr recv_anysource(std::vector<Tensor>& tensors, int tag);
  virtual WorkPtr barrier(const BarrierOptions& opts);
  // Reports every rank that did not arrive within the timeout (all of them with
  // wait_all_ranks, else the first one found). Ranks other than 0 begin their error with
  // monitored_barrier_failure_on(rank).
  virtual void monitored_barrier(const BarrierOptions& opts, bool wait_all_ranks);

  // The inline fast path: a synchronous operation run to completion on the calling thread
  // without creating a Work (null is returned); errors are thrown. An asynchronous send or
  // receive (InlineOp::hold) is posted and its Work returned. A backend that can run
  // an operation kind this way cheaply says so through has_inline(); ProcessGroup calls
  // run_inline() only then. The caller may still hold the GIL: run_inline() calls
  // core::before_blocking() before anything that can wait for long (a peer, a queue, a lock
  // another thread holds).
  virtual bool has_inline(core::OpType /*type*/) const { return false; }
  virtual WorkPtr run_inline(const InlineOp& op);

  // Adoption: a backend whose collectives work in place on memory it shares with its peers
  // (shm's heap) may move the whole pages of an ordinary buffer there, at the same addresses,
  // so that a buffer used again and again (a numpy array all_reduced or broadcast every step)
  // takes that path too. The caller, which tracks who owns the memory, must tell the process-level
  // registry (release_adopted_memory / forget_adopted_memory below) before the memory is freed
  // or changes hands. kBusy: try again later (an operation is in flight); kRefused: this
  // buffer cannot be adopted now. Nothing changes unless kDone.
  enum class Adoption { kDone, kBusy, kRefused };
  virtual bool adopts_memory() const { return false; }
  // Adopts [data, data + bytes), the buffer of a collective the caller is about to run.
  virtual Adoption adopt(void* /*data*/, size_t /*bytes*/) { return Adoption::kRefused; }
  // Whether part of [data, data + bytes) was adopted by this backend (without `verify`, the
  // record is trusted as it is: only for decisions a stale record cannot make unsafe).
  virtual bool adopted(const void* /*data*/, size_t /*bytes*/, bool /*verify*/) const {
    return false;
  }

  // An uninitialised C-contiguous tensor in memory this backend's collectives work on in place,
  // without staging copies (the shm backend's shared heap), for buffers allocated once and
  // reduced often, such as DDP's buckets; nullopt when the backend has no such memory or it
  // is full.
  virtual std::optional<Tensor> empty_for_collectives(const std::vector<int64_t>& /*sizes*/,
                                                      core::DType /*dtype*/) {
    return std::nullopt;
  }

  // Waits, at most `timeout` (kNoTimeout: as long as it takes), for the operations already
  // submitted to finish, as torch's backends finish their queue before going away
  // (ProcessGroup::shutdown, i.e. destroy_process_group, calls it first). Not for destructors:
  // finishing operations may need the thread that drops the backend (a Python caller's GIL).
  virtual void finish_pending(Millis /*timeout*/) {}
  // Stops outstanding operations; later calls fail. Never blocks on peers.
  virtual void shutdown() {}

 protected:
  [[noreturn]] void throw_not_supported(const char* op) const;

 private:
  const int rank_;
  const int size_;
  std::atomic<Millis::rep> timeout_ms_;
  mutable std::mutex group_mutex_;
  std::function<std::optional<uint64_t>()> group_sequence_;  // guarded by group_mutex_
};

}  // namespace c10d::pg
